"""PD disaggregation: a prefill engine and a decode engine, and the KV handoff between them.

Bottom to top: ``handoff`` (one request's state machine and the messages), ``wire`` (which bytes of a
request cross, in canonical order), ``staging`` (the decode side's ring on an even chunk grid),
``decode`` (the decode server), ``prefill`` (the prefill engine and the KV sender), ``base`` (the
transport interface, as SGLang's ``disaggregation/base``), ``inproc/`` (both sides in this process:
SGLang's ``fake`` transport, ours), ``remote`` (the decode server in a child process), ``nixl/`` and
``mooncake/`` (pages written over NIXL or Mooncake's transfer engine), and ``disagg`` (the engine a
cell runs: both sides stepped together). A transport is one folder with its ``conn.py``.
"""
