"""``pd = nixl``: the decode server in a child process; the prefill side WRITEs pages into its pool over NIXL."""
