"""What every engine's reproducer script shares, whatever the engine (this package imports no engine package):
``text``, the parts a script is assembled from; ``checks``, the check a script judges, copied in verbatim (the standard
library alone); ``install``, the Makefile's pins a REPORT's install lines read; ``writer``, the ``ScriptWriter`` an
engine's package declares (``Engine.writers``). Each engine's own writer and the code its scripts carry verbatim live
in its package (``harness.sut.vllm.script`` and ``standalone``, for one)."""
