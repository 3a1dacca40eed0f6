"""The models the engines serve, made here: checkpoints of the reference's seeded weights (``checkpoints``, by the
Llama names in ``weights``), their GGUF for llama.cpp (``gguf_weights``, ``gguf_export``) and the trained SmolLM2
(``trained``). Below every engine package, which reads them; imports none of them."""
