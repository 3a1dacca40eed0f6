"""``pd = inproc``: both engines in this process; blocks are copied byte for byte between their regions."""
