"""The wire formats a server is driven over, and what the harness reads back from its answers.

The documented ones: OpenAI completions as vLLM and SGLang serve them (token ids as ``token_id:N`` strings),
llama.cpp's ``/completion`` and SGLang's native ``/generate``; each request is a token-id prompt, greedy, exactly
the requested tokens, with top-2 logprobs. A response that lacks a field, or holds one of another type, raises
``ServerError`` naming the field. Prometheus text (``/metrics``) is read as per-metric sums.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from reference_impl.request import RequestOutput, RequestSpec

class ServerError(RuntimeError):
    """The server died, hung, never became healthy, or answered outside its wire format; the message says which."""


def field_at(doc: object, dotted: str, kind: type | tuple[type, ...], what: str) -> object:
    """``doc`` at the dotted path (``choices.0.logprobs``) if it is a ``kind``; else ``ServerError`` naming the
    field, so a malformed response says exactly what it lacks."""
    value = doc
    for part in dotted.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise ServerError(f"malformed response {what}: no field {dotted!r}")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ServerError(f"malformed response {what}: field {dotted!r} should be {names}, got {value!r:.80}")
    return value


def _number_list(doc: object, dotted: str, kind: type, what: str) -> list:
    values = field_at(doc, dotted, list, what)
    for i, value in enumerate(values):
        field_at(values, str(i), kind if kind is int else (int, float), what)
    return list(values)


@dataclass(frozen=True, slots=True)
class Generated:
    """One request's generation as any wire format gives it: the harness's own names."""

    tokens: list[int]
    logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]
    finish_reason: str
    verified: tuple[int, ...] | None = None  # the steps a verify step emitted, where the format says (else None)


def openai_body(request: RequestSpec, top: int, model: str) -> dict:
    """OpenAI completions: a token-id prompt, greedy, ``top`` logprobs (vLLM's and SGLang's extensions fix the
    length: the file's ``request`` adds ``min_tokens``/``ignore_eos``)."""
    return {"model": model, "prompt": list(request.prompt), "max_tokens": request.max_new_tokens, "temperature": 0.0,
            "logprobs": top, "stream": False}


_TOKEN_ID = re.compile(r"token_id:(-?\d+)")


def _token_id(text: str, what: str) -> int:
    match = _TOKEN_ID.fullmatch(text)
    if match is None:
        raise ServerError(f"malformed response {what}: token {text!r:.40} is not 'token_id:N' (start vLLM with "
                          f"--return-tokens-as-token-ids)")
    return int(match.group(1))


def openai_parse(doc: object, what: str) -> Generated:
    choice = field_at(doc, "choices.0", dict, what)
    logprobs = field_at(choice, "logprobs", dict, what)
    tokens = [_token_id(t, what) for t in field_at(logprobs, "tokens", list, what)]
    chosen = _number_list(logprobs, "token_logprobs", float, what)
    steps = field_at(logprobs, "top_logprobs", list, what)
    top_ids, top_lps = [], []
    for i, step in enumerate(steps):
        ranked = sorted(((float(lp), _token_id(t, what)) for t, lp in field_at(steps, str(i), dict, what).items()),
                        key=lambda pair: -pair[0])
        top_ids.append([tid for _, tid in ranked])
        top_lps.append([lp for lp, _ in ranked])
    return Generated(tokens, chosen, top_ids, top_lps, str(field_at(choice, "finish_reason", str, what)))


def llamacpp_body(request: RequestSpec, top: int, model: str) -> dict:
    """llama.cpp's /completion: token ids in and out, greedy, exactly ``n_predict`` tokens, raw top-``top``."""
    return {"prompt": list(request.prompt), "n_predict": request.max_new_tokens, "temperature": 0.0, "top_k": 1,
            "ignore_eos": True, "n_probs": top, "post_sampling_probs": False, "return_tokens": True,
            "stream": False}


#: llama.cpp's stop_type → the finish reason the oracles read.
LLAMACPP_FINISH = {"limit": "length", "eos": "stop", "word": "stop", "none": "none"}


def llamacpp_parse(doc: object, what: str) -> Generated:
    tokens = _number_list(doc, "tokens", int, what)
    steps = field_at(doc, "completion_probabilities", list, what)
    chosen, top_ids, top_lps = [], [], []
    for i in range(len(steps)):
        step = field_at(steps, str(i), dict, what)
        chosen.append(float(field_at(step, "logprob", (int, float), what)))
        ranked = field_at(step, "top_logprobs", list, what)
        top_ids.append([int(field_at(ranked, f"{j}.id", int, what)) for j in range(len(ranked))])
        top_lps.append([float(field_at(ranked, f"{j}.logprob", (int, float), what)) for j in range(len(ranked))])
    stop = str(field_at(doc, "stop_type", str, what))
    # a token a verify step emits (a drafted one the target accepted, or the one it sampled after them) comes back
    # without the top logprobs asked for (server-context.cpp: "result.prob = 1.0f; // set later", "TODO: set
    # result.probs"); a token decoded alone always has them (populate_token_probs)
    verified = tuple(i for i, ranked in enumerate(top_ids) if not ranked)
    return Generated(tokens, chosen, top_ids, top_lps, LLAMACPP_FINISH.get(stop, stop), verified)


def sglang_body(request: RequestSpec, top: int, model: str) -> dict:
    """SGLang's native /generate: ``input_ids``, greedy, exactly ``max_new_tokens`` (``ignore_eos``), top-``top``
    logprobs of the output. No ``min_new_tokens``: SGLang 0.5.23 refuses it under ``--skip-tokenizer-init`` ("requires
    tokenizer for eos_token_id"), and with the end-of-sequence token ignored it adds nothing."""
    return {"input_ids": list(request.prompt), "return_logprob": True, "top_logprobs_num": top,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": request.max_new_tokens, "ignore_eos": True}}


def sglang_parse(doc: object, what: str) -> Generated:
    tokens = _number_list(doc, "output_ids", int, what)
    chosen_steps = field_at(doc, "meta_info.output_token_logprobs", list, what)
    chosen = [float(field_at(chosen_steps, f"{i}.0", (int, float), what)) for i in range(len(chosen_steps))]
    steps = field_at(doc, "meta_info.output_top_logprobs", list, what)
    top_ids, top_lps = [], []
    for i in range(len(steps)):
        ranked = field_at(steps, str(i), list, what)
        top_lps.append([float(field_at(ranked, f"{j}.0", (int, float), what)) for j in range(len(ranked))])
        top_ids.append([int(field_at(ranked, f"{j}.1", int, what)) for j in range(len(ranked))])
    return Generated(tokens, chosen, top_ids, top_lps, str(field_at(doc, "meta_info.finish_reason.type", str, what)))


@dataclass(frozen=True, slots=True)
class Api:
    """A wire format: the request body for one request, and the generation read back from its response."""

    body: Callable[[RequestSpec, int, str], dict]
    parse: Callable[[object, str], Generated]


API: Mapping[str, Api] = {
    "openai": Api(openai_body, openai_parse),
    "llamacpp": Api(llamacpp_body, llamacpp_parse),
    "sglang": Api(sglang_body, sglang_parse),
}


@dataclass(frozen=True, slots=True)
class Reply:
    """One response as the harness reads it: the output the oracles judge, its per-request counters, and what the
    server says of how it served it, where its format says: the slot (llama.cpp's ``id_slot``) and the reply's steps
    a verify step emitted (else None)."""

    output: RequestOutput
    counters: dict[str, int]
    slot: int | None = None
    verified: tuple[int, ...] | None = None


#: where each wire format names the slot (or worker) that served a request, where it does
SLOT_FIELD = {"llamacpp": "id_slot"}


def request_output(server: Mapping, request: RequestSpec, doc: object, counted: bool = True) -> Reply:
    """One response read through the server's format (``counted``: a cell with a proposer, whose responses must carry
    the per-request counters)."""
    what = f"to request {request.rid!r}"
    gen = API[server["api"]].parse(doc, what)
    for name, values in (("logprobs", gen.logprobs), ("top_logprobs", gen.top_logprobs)):
        if len(values) != len(gen.tokens):
            raise ServerError(f"malformed response {what}: {len(gen.tokens)} tokens but {len(values)} {name}")
    cached = int(field_at(doc, server["cached_tokens"], int, what))
    counters = {name: int(field_at(doc, where, int, what))
                for name, (kind, where) in server["counters"].items() if kind == "response" and counted}
    slot = SLOT_FIELD.get(server["api"])
    return Reply(RequestOutput(
        rid=request.rid, tokens=gen.tokens, logprobs=gen.logprobs, top_ids=gen.top_ids,
        top_logprobs=gen.top_logprobs, margins=[s[0] - s[1] if len(s) > 1 else math.inf for s in gen.top_logprobs],
        cached_tokens=cached, cached_device=cached, finish_reason=gen.finish_reason,
    ), counters, None if slot is None else int(field_at(doc, slot, int, what)), gen.verified)


def pass_counters(counters: dict[str, int], outputs: Sequence[RequestOutput]) -> dict[str, int]:
    """A pass's speculative counters as the accept_length oracle reads them. Verify steps alone are SGLang's
    accounting (accept length = generated tokens / verify steps): drafts = steps, accepted = generated - steps."""
    if "verify_steps" not in counters:
        return counters
    steps = counters["verify_steps"]
    rest = {name: value for name, value in counters.items() if name != "verify_steps"}
    return {**rest, "drafts": steps, "accepted_tokens": sum(len(o.tokens) for o in outputs) - steps}


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """A Prometheus text exposition's samples: (name, labels, value), comments skipped."""
    out = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            raise ServerError(f"malformed metrics: {line[:120]!r} has no number") from None
        out.append((match.group(1), dict(_LABEL.findall(match.group(2) or "")), value))
    return out


def metric_sums(text: str) -> dict[str, float]:
    """A Prometheus text exposition's samples, summed over label sets by metric name."""
    sums: dict[str, float] = {}
    for name, _, value in samples(text):
        sums[name] = sums.get(name, 0.0) + value
    return sums
