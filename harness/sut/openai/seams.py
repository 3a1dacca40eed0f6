"""A server cell's seams for the boundary family (``fixtures/workloads/boundary.py``): its page, step budget and
context as the cell's launch asks for them (its flags, rendered over the cell's levels), each server's default where
the launch leaves one out. The page the server applied, where the cell's first run read it back, wins
(``harness.run.boundary.cell_seams``).

- vLLM's api_server: ``--block-size`` (else the cell's ``page_size``), ``--max-num-batched-tokens`` (else 2048, vLLM
  V1's default on CPU), ``--max-model-len`` (else the made checkpoints' ``max_position_embeddings``);
- llama.cpp: token-granular (a slot's longest common prefix: page 1), ``-b`` (else 2048, ``common/common.h``
  n_batch), ``-c`` shared by ``-np`` slots unless the KV cache is unified (``-np`` left out: 4 slots, unified);
- SGLang: ``--page-size`` (else the cell's), ``--chunked-prefill-size`` (else 8192), ``--context-length``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from fixtures.workloads.boundary import Seams
from harness.models.checkpoints import MAX_POSITIONS, vocab_size
from harness.sut.openai.table import placeholders

#: each server's step budget where the launch sets none
DEFAULT_BUDGET = {"openai": 2048, "llamacpp": 2048, "sglang": 8192}


def launch_argv(server: Mapping, levels: Mapping[str, object]) -> list[str]:
    """The cell's command line as far as its levels render it (an artefact's placeholder, a path made on first use
    and no seam, is left as it is: nothing is built)."""
    def render(text: str, level: object = None) -> str:
        names = set(placeholders(text))
        return text.format(**levels, level=level) if names <= {*levels, "level"} else text

    argv = [render(part) for part in server["command"]]
    for factor, level in levels.items():
        entry = server["levels"].get(factor, {}).get(str(level))
        if entry is not None:
            argv += [render(part, level) for part in entry["flags"]]
    return argv


def _flag(argv: Sequence[str], names: Sequence[str], default: int | None) -> int | None:
    """The last value of any of ``names`` (``--name value`` or ``--name=value``), else ``default``."""
    found = default
    for i, arg in enumerate(argv):
        flag, eq, inline = arg.partition("=")
        if flag in names:
            text = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            found = int(text) if text.lstrip("-").isdigit() else found
    return found


def _llamacpp_context(argv: Sequence[str]) -> int | None:
    """A slot's context: ``-c`` split among ``-np`` slots, whole where the KV cache is unified or ``-np`` is left out."""
    ctx = _flag(argv, ("-c", "--ctx-size"), None)
    slots = _flag(argv, ("-np", "--parallel"), -1)
    unified = any(arg in ("-kvu", "--kv-unified") for arg in argv) or slots == -1
    return None if ctx is None or ctx == 0 else (ctx if unified else ctx // max(slots, 1))


def seams(server: Mapping, levels: Mapping[str, object]) -> Seams:
    """The seams a server cell's launch asks for (its full levels, its ``[server]`` table)."""
    argv, api = launch_argv(server, levels), str(server.get("api", "openai"))
    k = int(levels.get("num_draft_tokens", 0)) if levels.get("spec", "none") != "none" else 0
    budget = DEFAULT_BUDGET.get(api, 2048)
    if api == "llamacpp":
        page, context = 1, _llamacpp_context(argv)
        budget = _flag(argv, ("-b", "--batch-size"), budget)
    elif api == "sglang":
        page = _flag(argv, ("--page-size",), int(levels.get("page_size", 1)))
        budget = _flag(argv, ("--chunked-prefill-size",), budget)
        context = _flag(argv, ("--context-length",), MAX_POSITIONS)
    else:
        page = _flag(argv, ("--block-size",), int(levels.get("page_size", 1)))
        budget = _flag(argv, ("--max-num-batched-tokens",), budget)
        context = _flag(argv, ("--max-model-len",), MAX_POSITIONS)
    if budget is None or budget <= 0:  # chunked prefill off (SGLang's -1): a whole prompt is one step
        budget = context or MAX_POSITIONS
    return Seams(page=page, budget=budget, k=k, context=context, vocab=vocab_size(str(levels["model"])))
