"""The stand-in's KV cache utilities: a script's ``hold_requests`` imports the module; the stand-in ``LLM`` never
sizes a cache, so nothing in it is called."""
