"""Child program that drives vLLM's offline API for the harness over line-delimited JSON.

Run it with vLLM's interpreter (``.venv-vllm/bin/python -I harness/sut/vllm/child.py``): it imports
only the standard library, vllm and torch, never our packages, since those live in another venv.
One JSON object per line on stdin, one answer per line on stdout, logs on stderr:

    {"op": "start", "engine_args": {...}, "poison": bool, "audit": bool, "hold": n}
                                                   -> {"ok": true, "seconds": s, "applied": {...}, "poisoned"?: {...},
                                                      "resized"?: {...}}: what vLLM applied of the arguments
                                                      (``applied_config``), read back; ``resized``: the arguments
                                                      this child raised (``hold_requests``); ``poison``: its KV
                                                      cache NaN-poisoned (``poison.py``), ``audit``: its block pool audited after every step (``audit.py``)
    {"op": "serve", "requests": [{"rid", "prompt", "max_new_tokens", "priority", "kv_transfer_params"?}],
     "top_logprobs": 2}
        -> {"ok": true, "seconds": s, "outputs": [{"rid", "tokens", "logprobs", "top_ids", "top_logprobs",
            "num_cached_tokens", "finish_reason", "kv_transfer_params"}], "spec": {"drafts", "draft_tokens",
            "accepted_tokens", "accepted_per_pos"}, "connector": {name: count over this serve},
            "scheduler": {"preemptions", "evicted_blocks", "placeholder_drafts", "placeholder_tokens"}, "inputs": {"call", "where", "compared", "changes"}, "audit"?:
            {"steps", "count", "problems"}, "poison"?: {"issued", "freed"}}: what generate changed of its inputs; the audit's and the poison's since the last serve (a reset's steps too)
    {"op": "reset", "reset_connector": bool, "settle_s": s}
                                                   -> {"ok": true, "reset": bool, "steps": n}: an empty prefix cache
                                                      (and, asked, the KV connector's), so the next pass starts
                                                      cold; within settle_s the idle engine is stepped until
                                                      the blocks it holds for a PD handoff are free
    {"op": "layout"}                               -> {"ok": true, "block_size", "block_bytes", "state_bytes"}: the
                                                      KV cache as applied (one block of every attention layer,
                                                      one request's state in every Mamba layer, in bytes)
    {"op": "close"}                                -> {"ok": true}, then exit 0

Any op may carry ``timeout_s``: past it the child dumps every thread's stack to stderr and exits 3,
so a wedged engine shows up to the parent as end of file, never as a hang. Every failure answers
``{"ok": false, "error": "<type>: <message>", "traceback": "..."}`` and the child keeps serving.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

#: engine arguments the protocol depends on: token-id prompts (no tokenizer), one in-process worker,
#: and stat logging, without which LLM.get_metrics() asserts and the speculative counters are lost.
FORCED_ARGS = {"skip_tokenizer_init": True, "distributed_executor_backend": "uni", "disable_log_stats": False}

#: defaults a caller may override: eager mode, which starts in ~8 s where torch.compile takes 20-70 s
#: on 2 cores (its first serve pays ~5 s of lazy kernel setup, still well ahead; a tiny model gains
#: nothing from compiling); a fixed 256 MiB KV cache, because the CPU default reserves 92% of the
#: machine's memory and refuses to start when others use some of it.
DEFAULT_ARGS = {"enforce_eager": True, "kv_cache_memory_bytes": 256 << 20}

#: prometheus names of the speculative counters, by the key the answer gives them.
SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
INPUTS = Path(__file__).parents[1] / "inputs.py"  # what a call is handed, compared after it (standard library only)
METRICS = Path(__file__).parents[1] / "vllm_common" / "metrics.py"


class ProtocolError(ValueError):
    """A request line the protocol cannot serve: not JSON, an unknown op, a missing field."""


class EngineFailedError(RuntimeError):
    """A serve after one that raised inside vLLM: its requests may still sit in the scheduler."""


class Child:
    """One vLLM engine at most, built by ``start`` and used by every ``serve`` after it.

    After an exception inside vLLM the engine may hold half-run requests that a later
    ``generate`` would drain into its own results, so every later serve is refused instead.
    """

    def __init__(self) -> None:
        self.llm: Any = None
        self.failed = ""
        self.evicted: list[int] | None = None  # cached blocks evicted so far (None: the engine core is elsewhere)
        self.placeholders: list[int] | None = None  # placeholder drafts and tokens scheduled so far (None: unseen)
        self.poison: Any = None  # poison.KvPoison, with "poison": true
        self.audit: Any = None  # audit.PoolAudit, with "audit": true

    def start(self, msg: dict) -> dict:
        if self.llm is not None:
            raise ProtocolError("start: the engine is already started (close this child and start another)")
        engine_args = msg.get("engine_args")
        if not isinstance(engine_args, dict) or "model" not in engine_args:
            raise ProtocolError("start: engine_args must be an object with at least 'model'")
        began = time.perf_counter()
        # In-process engine core: a second process would double start time and memory on a small CPU box, its
        # failures would surface here as a dead pipe instead of a traceback, and ``collective_rpc`` could not take a
        # function. Set before vllm loads, here rather than at import: the harness imports this file's metric tables.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM  # imported here: a malformed first line is answered without vLLM's 10 s import

        asked = engine_args.get("num_gpu_blocks_override")
        if asked is not None:
            hold_requests(int(msg.get("hold", 1)))
        self.llm = LLM(**{**DEFAULT_ARGS, **engine_args, **FORCED_ARGS})
        counts = sibling("counts")
        self.evicted, self.placeholders = counts.count_evictions(self.llm), counts.count_placeholders(self.llm)
        answer = {"seconds": time.perf_counter() - began, "applied": applied_config(self.llm)}
        sized = self.llm.llm_engine.vllm_config.cache_config.num_gpu_blocks_override
        if asked is not None and sized != asked:
            answer["resized"] = {"num_gpu_blocks_override": sized}
        if msg.get("poison"):
            self.poison = sibling("poison").KvPoison(self.llm)
            answer["poisoned"] = self.poison.describe()
        if msg.get("audit"):
            self.audit = sibling("audit").PoolAudit.of(self.llm)
        return answer

    def reset(self, msg: dict) -> dict:
        if self.llm is None:
            raise ProtocolError("reset: no engine yet (send start first)")
        # a PD prefill engine holds a finished request's blocks until the decode side has read them, and frees them
        # only at a later step: ``settle_s`` steps the idle engine (connector polling, no tokens) until they are free
        reset_connector, settle = bool(msg.get("reset_connector", False)), float(msg.get("settle_s", 0.0))
        began, steps = time.perf_counter(), 0
        while not (done := self.llm.reset_prefix_cache(reset_connector=reset_connector)):
            if time.perf_counter() - began >= settle:
                break
            self.llm.llm_engine.step()
            steps += 1
            time.sleep(0.01)
        return {"reset": bool(done), "steps": steps}

    def layout(self, msg: dict) -> dict:
        """The KV cache as applied (``kv_layout``)."""
        if self.llm is None:
            raise ProtocolError("layout: no engine yet (send start first)")
        return kv_layout(self.llm)

    def serve(self, msg: dict) -> dict:
        if self.llm is None:
            raise ProtocolError("serve: no engine yet (send start first)")
        if self.failed:
            raise EngineFailedError(f"the engine failed in an earlier serve ({self.failed}); close this child, start another")
        requests = msg.get("requests")
        if not isinstance(requests, list) or not requests:
            raise ProtocolError("serve: requests must be a non-empty list")
        from vllm import SamplingParams, TokensPrompt

        top = int(msg.get("top_logprobs", 2))
        prompts, params = [], []
        for req in requests:
            for field in ("rid", "prompt", "max_new_tokens"):
                if field not in req:
                    raise ProtocolError(f"serve: request {req.get('rid', '?')!r} has no {field!r}")
            prompts.append(TokensPrompt(prompt_token_ids=[int(t) for t in req["prompt"]]))
            n = int(req["max_new_tokens"])
            # a PD handoff's side, as vLLM's toy proxy asks it: the connector reads these from extra_args
            handoff = req.get("kv_transfer_params")
            extra = {"kv_transfer_params": handoff} if handoff is not None else None
            # greedy, exactly n tokens whatever the model emits, and no detokenizing (there is no tokenizer)
            params.append(SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True,
                                         logprobs=top, detokenize=False, extra_args=extra))
        # always passed: the priority scheduler orders by it (lower first), FCFS ignores it
        priority = [int(req.get("priority", 0)) for req in requests]
        metrics = self.llm.get_metrics()
        before, moved, scheduled = spec_counters(metrics), connector_counters(metrics), self.scheduler_counters(metrics)
        watch = sibling("inputs", INPUTS).Watch.by_request([str(r["rid"]) for r in requests], prompt=prompts, sampling_params=params, priority=priority)
        began = time.perf_counter()
        try:
            results = self.llm.generate(prompts, params, use_tqdm=False, priority=priority)
        except Exception as exc:
            self.failed = f"{type(exc).__name__}: {exc}"
            raise
        seconds = time.perf_counter() - began
        metrics = self.llm.get_metrics()
        after = connector_counters(metrics)
        outputs = [request_output(req["rid"], res, top) for req, res in zip(requests, results)]
        now = self.scheduler_counters(metrics)
        answer = {"seconds": seconds, "outputs": outputs, "spec": counter_delta(before, spec_counters(metrics)),
                  "connector": {key: after[key] - moved[key] for key in after},
                  "scheduler": {key: now[key] - scheduled[key] for key in now}, "inputs": watch.check("LLM.generate", "vLLM, in this process").to_json()}
        if self.audit is not None:  # the audit names requests by vLLM's ids, the answer by the caller's
            answer["audit"] = self.audit.take({res.request_id: req["rid"] for req, res in zip(requests, results)})
        if self.poison is not None:
            answer["poison"] = self.poison.take()
        return answer

    def scheduler_counters(self, metrics: list) -> dict:
        """Requests preempted so far (vLLM's ``vllm:num_preemptions``), cached blocks evicted and placeholder drafts
        scheduled (``counts.py``; each absent where the engine core runs in another process and cannot be
        counted)."""
        preempted = sum(int(m.value) for m in metrics if m.name == "vllm:num_preemptions")
        placeholders = {} if self.placeholders is None else {"placeholder_drafts": self.placeholders[0],
                                                              "placeholder_tokens": self.placeholders[1]}
        return {"preemptions": preempted, **({} if self.evicted is None else {"evicted_blocks": self.evicted[0]}),
                **placeholders}


def sibling(name: str, path: Path | None = None) -> Any:
    """This folder's module ``name`` (``poison``, ``audit``: they run in the child) or the one at ``path``, loaded by its path:
    ``-I`` keeps this folder off ``sys.path``, and the harness's package is not importable from vLLM's interpreter."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"kvmatrix_child_{name}", path or Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: what vLLM's KV connectors moved, read from its metrics as its api_server's reading reads them
#: (``harness.sut.vllm_common.metrics``: standard library only, loaded by its path)
connector_counters = sibling("metrics", METRICS).connector_counters


def hold_requests(requests: int = 1) -> None:
    """Raise a tight cell's KV blocks (``num_gpu_blocks_override``, the harness's ``tight_blocks``) to vLLM's own
    least for ``requests`` requests of ``max_model_len`` at once, one counted over its KV cache groups as vLLM's
    start-up check counts it (``vllm/v1/core/kv_cache_utils.py``, ``check_enough_kv_cache_memory``), plus the null
    block. A dense model's count is that least already; a hybrid model's Mamba state pages share the pool with its
    attention blocks, whose size vLLM raises to match them, so a count of attention pages alone is refused at
    start-up (and a PD prefill side sized in them would hold fewer requests of a round than it must)."""
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.engine import core

    configs = core.get_kv_cache_configs

    def sized(vllm_config: Any, kv_cache_specs: list, available_memory: list) -> Any:
        cache = vllm_config.cache_config
        specs = {name: spec for worker in kv_cache_specs for name, spec in worker.items()}
        groups = kv_cache_utils.get_kv_cache_groups(vllm_config, dict(specs))
        if groups:  # counted as the check counts it: per group, padded to uniform groups (a draft's layers too)
            needed = kv_cache_utils._max_memory_usage_bytes_from_groups(vllm_config, groups)
            per_block = kv_cache_utils._pool_bytes_per_block(vllm_config, groups)
            least = requests * -(-needed // per_block) + 1
            cache.num_gpu_blocks_override = max(cache.num_gpu_blocks_override, least)
        return configs(vllm_config, kv_cache_specs, available_memory)

    core.get_kv_cache_configs = sized


def applied_config(llm: Any) -> dict:
    """The settings vLLM applied, read from its config after start (a platform may override what was asked:
    ``vllm/platforms/cpu.py`` turns async scheduling off), with the KV blocks it allocated."""
    config = llm.llm_engine.vllm_config
    cache, scheduler, spec = config.cache_config, config.scheduler_config, config.speculative_config
    return {"async_scheduling": bool(scheduler.async_scheduling), "block_size": int(cache.block_size),
            "kv_cache_dtype": str(cache.cache_dtype), "enable_prefix_caching": bool(cache.enable_prefix_caching),
            "max_num_seqs": int(scheduler.max_num_seqs), "max_num_batched_tokens": int(scheduler.max_num_batched_tokens),
            "num_gpu_blocks": cache.num_gpu_blocks, "max_model_len": int(config.model_config.max_model_len),
            "spec_method": None if spec is None else str(spec.method),
            "num_speculative_tokens": None if spec is None else int(spec.num_speculative_tokens),
            "drops_eagle_block": spec is not None and bool(spec.use_eagle_block_drop())}


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


def request_output(rid: str, result: Any, top: int) -> dict:
    """One request's answer: its tokens, each one's logprob, the top-``top`` per step, cached tokens."""
    completion = result.outputs[0]
    tokens = list(completion.token_ids)
    logprobs, top_ids, top_logprobs = [], [], []
    for token, step in zip(tokens, completion.logprobs or []):
        logprobs.append(step[token].logprob)
        # the step holds the top-N by rank plus the chosen token, which may rank lower
        best = sorted((lp.rank, tid, lp.logprob) for tid, lp in step.items() if lp.rank is not None and lp.rank <= top)
        top_ids.append([tid for _, tid, _ in best])
        top_logprobs.append([lp for _, _, lp in best])
    return {"rid": rid, "tokens": tokens, "logprobs": logprobs, "top_ids": top_ids, "top_logprobs": top_logprobs,
            "num_cached_tokens": result.num_cached_tokens or 0, "finish_reason": completion.finish_reason,
            "kv_transfer_params": result.kv_transfer_params}


def spec_counters(metrics: list) -> dict:
    """The speculative counters of a metrics snapshot, summed over their label sets (one per engine)."""
    out: dict[str, Any] = {key: 0 for key in SPEC_COUNTERS}
    out["accepted_per_pos"] = []
    names = {name: key for key, name in SPEC_COUNTERS.items()}
    for metric in metrics:
        if metric.name in names:
            out[names[metric.name]] += int(metric.value)
        elif metric.name == SPEC_PER_POS:
            per_pos = out["accepted_per_pos"]
            per_pos.extend([0] * (len(metric.values) - len(per_pos)))
            for pos, value in enumerate(metric.values):
                per_pos[pos] += int(value)
    return out


def counter_delta(before: dict, after: dict) -> dict:
    """``after - before``, position by position for the per-position vector."""
    out = {key: after[key] - before[key] for key in SPEC_COUNTERS}
    old = before["accepted_per_pos"] + [0] * (len(after["accepted_per_pos"]) - len(before["accepted_per_pos"]))
    out["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], old)]
    return out


def failure(exc: BaseException) -> dict:
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def handle(child: Child, line: str) -> tuple[dict, bool]:
    """The answer to one request line, and whether the child should exit after sending it."""
    try:
        msg = json.loads(line)
        if not isinstance(msg, dict):
            raise ProtocolError(f"a request must be a JSON object, got {type(msg).__name__}")
        timeout = msg.get("timeout_s")
        if timeout is not None:
            faulthandler.dump_traceback_later(float(timeout), exit=True)
        op = msg.get("op")
        if op == "close":
            return {"ok": True}, True
        if op not in ("start", "serve", "reset", "layout"):
            raise ProtocolError(f"unknown op {op!r} (known: start, serve, reset, layout, close)")
        return {"ok": True, **getattr(child, op)(msg)}, False
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the parent, which decides
        return failure(exc), False
    finally:
        faulthandler.cancel_dump_traceback_later()


def protocol_stream() -> TextIO:
    """A private copy of stdout for answers; fd 1 then points at stderr.

    vLLM's logger and native libraries write to stdout, and a stray line there would break the
    protocol, so everything but our answers goes to stderr.
    """
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return out


def main() -> int:
    answers = protocol_stream()
    child = Child()
    for line in sys.stdin:
        if not line.strip():
            continue
        answer, done = handle(child, line)
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
        if done:
            break
    # a closed stdin is the parent leaving: exit cleanly rather than wait on anything
    return 0


if __name__ == "__main__":
    sys.exit(main())
