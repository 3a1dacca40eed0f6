"""The stand-in's ``vllm.v1.engine``."""
