"""The stand-in's ``vllm.v1``: what a script's copied-in child code imports of it."""
