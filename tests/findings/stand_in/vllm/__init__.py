"""A stand-in for vLLM's offline API without any finding's bug: what a reproducer script reads of it (``LLM``,
``generate``'s outputs with their logprobs, ``get_metrics``' speculative counters, ``reset_prefix_cache``) made up
from the prompts alone, so the failing setting and the toggled one serve alike, as a fixed vLLM would."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace


def TokensPrompt(prompt_token_ids: list[int]) -> dict:  # noqa: N802 - vLLM's TypedDict is called so
    return {"prompt_token_ids": prompt_token_ids}


class SamplingParams(SimpleNamespace):
    """What was asked: ``max_tokens`` is all the stand-in reads."""


@dataclass
class Metric:
    name: str
    value: int


class LLM:
    """Greedy tokens that follow the prompt's last token; with a proposer, one draft of ``k`` tokens per token decoded
    past the first, every one accepted."""

    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs
        self.counts = dict.fromkeys(("drafts", "draft_tokens", "accepted_tokens"), 0)

    def generate(self, prompts: list[dict], params: list[SamplingParams], use_tqdm: bool = False,
                 priority: list[int] | None = None) -> list[SimpleNamespace]:
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
            completion = SimpleNamespace(token_ids=tokens, logprobs=steps, finish_reason="length")
            results.append(SimpleNamespace(outputs=[completion], num_cached_tokens=0, kv_transfer_params=None))
        return results

    def get_metrics(self) -> list[Metric]:
        return [Metric(f"vllm:spec_decode_num_{key}", value) for key, value in self.counts.items()]

    def reset_prefix_cache(self, reset_connector: bool = False) -> bool:
        return True
