"""The vllm engine's groundwork: the dense export keeps the reference's function, and the child speaks its protocol.

The export test runs in our venv with plain torch. The child tests (marked ``vllm``) need
``.venv-vllm`` (``make vllm-env``): they skip without it, except under CI=true, where a missing
environment is a broken build and fails.
"""
from __future__ import annotations

import ast
import json
import math
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fixtures.workloads import load_workload
from harness.sut.reference.engine import build_engine_config, make_engine
from harness.models import checkpoints
from harness.models.checkpoints import SERVED_DENSE, checkpoint_dir
from tests.binaries import required_path
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[4]
pytestmark = pytest.mark.xdist_group("vllm")  # make test's --dist loadgroup: one vLLM child at a time
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CHILD = ROOT / "harness" / "sut" / "vllm" / "child.py"
#: an engine start is 20-70 s on 2 cores; a serve of a few short requests well under 10
START_TIMEOUT_S = 300
SERVE_TIMEOUT_S = 120


# -- the dense export, judged by an independent Llama forward ------------------------------------
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def llama_logits(ckpt: Path, ids: list[int]) -> torch.Tensor:
    """HF Llama's forward as transformers writes it (rotate_half RoPE, repeat_kv GQA), from config.json alone."""
    cfg = json.loads((ckpt / "config.json").read_text())
    w = load_file(ckpt / "model.safetensors")
    heads, kv_heads, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    n = len(ids)
    inv_freq = 1.0 / cfg["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)
    cos, sin = torch.cat([freqs, freqs], -1).cos()[None], torch.cat([freqs, freqs], -1).sin()[None]
    mask = torch.full((n, n), float("-inf")).triu(1)
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(n, heads, head_dim).transpose(0, 1)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(n, kv_heads, head_dim).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, kv_heads, head_dim).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
        attn = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(head_dim) + mask, -1) @ v
        x = x + attn.transpose(0, 1).reshape(n, heads * head_dim) @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


@pytest.fixture(scope="module")
def checkpoint_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(checkpoints.CACHE_ENV, str(root))
        yield root


def test_dense_export_reproduces_reference(checkpoint_cache: Path) -> None:
    workload = load_workload("long_prompts")
    config = replace(build_engine_config({}, workload, frozenset()), model=SERVED_DENSE)
    golden = {out.rid: out for out in make_engine(config).generate(workload.requests)}
    ckpt = checkpoint_dir("dense")
    for spec in workload.requests:
        out = golden[spec.rid]
        ids = list(spec.prompt) + out.tokens[:-1]
        logprobs = torch.log_softmax(llama_logits(ckpt, ids), -1)[len(spec.prompt) - 1 :]
        assert logprobs.argmax(-1).tolist() == out.tokens, f"{spec.rid}: the Llama export's greedy tokens differ"
        for step, (top_ids, top_lps) in enumerate(zip(out.top_ids, out.top_logprobs)):
            got = logprobs[step, top_ids]
            assert torch.allclose(got, torch.tensor(top_lps), atol=1e-4), (
                f"{spec.rid} step {step}: Llama logprobs {got.tolist()} of the reference's top ids {top_ids}, "
                f"reference {top_lps}")


def test_checkpoints_build_deterministically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = []
    for run in ("a", "b"):
        monkeypatch.setenv(checkpoints.CACHE_ENV, str(tmp_path / run))
        builds.append({name: checkpoint_dir(name) for name in checkpoints.RECIPES})
    for name in checkpoints.RECIPES:
        first, second = builds[0][name], builds[1][name]
        assert first.name == second.name, f"{name}: the cache key changed between two builds"
        for file in ("config.json", "model.safetensors"):
            assert (first / file).read_bytes() == (second / file).read_bytes(), f"{name}/{file} differs between builds"
    assert checkpoint_dir(str(builds[0]["draft"])) == builds[0]["draft"], "a checkpoint named by path comes back as is"


# -- the child ------------------------------------------------------------------------------------
def test_child_imports_nothing_of_ours() -> None:
    """The child runs under .venv-vllm, where our packages are not installed."""
    allowed = set(sys.stdlib_module_names) | {"vllm", "torch", "__future__"}
    for node in ast.walk(ast.parse(CHILD.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for name in names:
            assert name.split(".")[0] in allowed, f"child.py line {node.lineno} imports {name}"


class ChildProcess:
    """harness/sut/vllm/child.py under .venv-vllm; every answer is awaited with a deadline, so a hang fails the test."""

    def __init__(self, python: Path) -> None:
        self.proc = subprocess.Popen([str(python), "-I", str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=sys.stderr, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def send_line(self, line: str, timeout: float) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        try:
            return json.loads(self.lines.get(timeout=timeout))
        except queue.Empty:
            pytest.fail(f"the vLLM child gave no answer to {line[:200]!r} within {timeout} s")

    def ask(self, msg: dict, timeout: float = SERVE_TIMEOUT_S) -> dict:
        return self.send_line(json.dumps(msg), timeout)

    def close(self) -> int:
        if self.proc.poll() is None:
            self.ask({"op": "close"}, timeout=30)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return required_path(VLLM_PYTHON, "vllm-env")


@pytest.fixture(scope="module")
def dense_child(vllm_python: Path, checkpoint_cache: Path) -> Iterator[ChildProcess]:
    child = ChildProcess(vllm_python)
    engine_args = {"model": str(checkpoint_dir("dense")), "dtype": "float32", "max_model_len": 512,
                   "block_size": 32, "enable_prefix_caching": True, "scheduling_policy": "priority",
                   # a fixed KV budget: the default reserves 92% of the machine's memory
                   "kv_cache_memory_bytes": 64 << 20}
    started = child.ask({"op": "start", "engine_args": engine_args}, timeout=START_TIMEOUT_S)
    assert started["ok"], started.get("traceback", started)
    yield child
    assert child.close() == 0, "the vLLM child did not exit 0 after close"


@pytest.mark.vllm
def test_child_serves_requests(dense_child: ChildProcess) -> None:
    head = list(range(40))
    requests = [{"rid": "a", "prompt": head + [7, 8, 9], "max_new_tokens": 5, "priority": 1},
                {"rid": "b", "prompt": head + [3], "max_new_tokens": 3, "priority": 0}]
    answer = dense_child.ask({"op": "serve", "requests": requests, "top_logprobs": 2})
    assert answer["ok"], answer.get("traceback", answer)
    assert answer["seconds"] > 0
    assert set(answer["spec"]) == {"drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos"}
    # of what LLM.generate is handed, vLLM 0.32 writes one field in place: each SamplingParams' output_kind, set to
    # FINAL_ONLY by LLM._add_request (vllm/entrypoints/common/offline.py) before the engine clones it; prompts and
    # priorities are left as they were
    changed = {(c["request"], c["field"], c["before"], c["after"]) for c in answer["inputs"]["changes"]}
    assert changed == {(rid, "sampling_params.output_kind", "'RequestOutputKind.CUMULATIVE'",
                        "'RequestOutputKind.FINAL_ONLY'") for rid in ("a", "b")}, answer["inputs"]
    by_rid = {out["rid"]: out for out in answer["outputs"]}
    assert set(by_rid) == {"a", "b"}
    for req in requests:
        out, n = by_rid[req["rid"]], req["max_new_tokens"]
        assert len(out["tokens"]) == len(out["logprobs"]) == len(out["top_ids"]) == len(out["top_logprobs"]) == n
        assert out["finish_reason"] == "length"
        for token, lp, ids, lps in zip(out["tokens"], out["logprobs"], out["top_ids"], out["top_logprobs"]):
            assert len(ids) == len(lps) == 2 and lps[0] >= lps[1]
            assert token == ids[0] and lp == pytest.approx(lps[0]), "greedy picks the top-1 token"
    again = dense_child.ask({"op": "serve", "requests": requests[:1], "top_logprobs": 2})
    assert again["ok"], again.get("traceback", again)
    (warm,) = again["outputs"]
    assert warm["num_cached_tokens"] == 32, "a second pass hits the prompt's one full block in the prefix cache"
    assert warm["tokens"] == by_rid["a"]["tokens"], "a cache hit changes no greedy token"
    # last, since it retires the engine: a failure inside vLLM, then every later serve refused
    bad = dense_child.ask({"op": "serve", "requests": [{"rid": "c", "prompt": [10**6], "max_new_tokens": 1}]})
    assert bad["ok"] is False and bad["traceback"], bad
    after = dense_child.ask({"op": "serve", "requests": requests[:1]})
    assert after["ok"] is False and "EngineFailedError" in after["error"], after


@pytest.mark.vllm
def test_child_answers_malformed_ops(vllm_python: Path) -> None:
    child = ChildProcess(vllm_python)
    try:
        for line, error in [("not json", "JSONDecodeError"), ('["op"]', "ProtocolError"),
                            ('{"op": "fly"}', "ProtocolError: unknown op"), ('{"op": "serve", "requests": []}', "no engine"),
                            ('{"op": "start", "engine_args": {}}', "ProtocolError")]:
            answer = child.send_line(line, timeout=30)
            assert answer["ok"] is False and error in answer["error"], (line, answer)
            assert answer["traceback"], "a failure carries its traceback"
    finally:
        assert child.close() == 0
