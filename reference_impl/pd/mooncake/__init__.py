"""``pd = mooncake``: the decode server in a child process; pages written over Mooncake's transfer engine (TCP)."""
