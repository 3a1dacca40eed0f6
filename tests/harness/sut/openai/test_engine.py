"""engine = "openai": the [server] table, the wire formats, and every way a server fails.

A stand-in server (tests/servers/fake_server.py) speaks OpenAI completions and misbehaves on demand: a
server that exits, never becomes healthy, is killed or hangs mid-pass, or answers malformed JSON must give
an ``error`` row naming what happened, within the cell's timeout, with no process of its group left.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from harness.matrix.file import load_matrix
from harness.matrix.model import MatrixError, generate
from harness.run.golden import GoldenRuns
from harness.run.cell import run_cell
from harness.results.rows import error_type
from harness.sut.openai.launch import Launch
from harness.sut.openai.server import ServerProcess
from harness.sut.openai.wire import ServerError, field_at, llamacpp_parse, metric_sums, openai_parse, request_output
from harness.sut.process import is_live
from reference_impl.request import RequestSpec

FAKE = Path(__file__).resolve().parents[4] / "tests" / "servers" / "fake_server.py"

MATRIX = """
[matrix]
name = "s"
engine = "openai"
mode = "full"
workloads = ["pair"]
timeout_s = {timeout}

[factors]
model = ["{model}"]
slots = [1]

[golden]
slots = 1

[server]
api = "openai"
command = ["{python}", "{fake}", "{{port}}", "{mode}", "{pids}", "{{checkpoint}}"]
health = "/health"
reset = "/reset"
start_timeout_s = {start_timeout}

[server.levels.slots]
flags = ["--slots={{level}}"]
{extra}
"""


def write_matrix(tmp_path: Path, mode: str = "ok", *, timeout: float = 60, start_timeout: float = 20,
                 extra: str = "") -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")  # a checkpoint of its own: no cross_engine reference serves it
    path = tmp_path / "s.toml"
    path.write_text(MATRIX.format(timeout=timeout, model=model, python=sys.executable, fake=FAKE, mode=mode,
                                  pids=tmp_path / "pids", start_timeout=start_timeout, extra=extra))
    return path


def run_one(tmp_path: Path, mode: str, **kwargs) -> tuple[object, float]:
    matrix = load_matrix(str(write_matrix(tmp_path, mode, **kwargs)))
    (cell,) = generate(matrix)
    began = time.perf_counter()
    row = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
    return row, time.perf_counter() - began


def alive(tmp_path: Path) -> list[int]:
    """The stand-in's processes (leader and forked workers) still running."""
    return [pid for pid in map(int, (tmp_path / "pids").read_text().split()) if is_live(pid)]


def test_a_well_behaved_server_is_judged_and_stopped(tmp_path: Path) -> None:
    row, _ = run_one(tmp_path, "child")
    assert row.status == "pass", row.error
    assert row.oracles["tokens"].status == "pass" and row.oracles["cross_engine"].status == "skip"
    assert len((tmp_path / "pids").read_text().split()) == 2  # the server forked a worker
    assert alive(tmp_path) == []


def test_a_servers_inputs_are_judged_as_the_harness_client_left_them(tmp_path: Path) -> None:
    """The server is another process: what the inputs oracle can judge is the client's own path, and it says so."""
    row, _ = run_one(tmp_path, "ok")
    verdict = row.oracles["inputs"]
    assert verdict.status == "pass", verdict.message
    assert "POST /v1/completions: " in verdict.message and "cannot write the caller's memory" in verdict.message


def test_a_client_that_changes_a_request_body_fails_inputs_naming_the_field(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    call = ServerProcess.call

    def trimming(self: ServerProcess, path: str, body: dict | None, *args: object, **kwargs: object) -> object:
        answer = call(self, path, body, *args, **kwargs)
        if body is not None and "prompt" in body:
            body["prompt"].pop()  # after sending: the server got it whole, the caller's body is cut
        return answer

    monkeypatch.setattr(ServerProcess, "call", trimming)
    row, _ = run_one(tmp_path, "ok")
    verdict = row.oracles["inputs"]
    assert verdict.status == "fail", verdict.message
    first = verdict.detail[0]
    assert first["call"] == "POST /v1/completions" and first["request"] in ("pair-0", "pair-1")  # sent side by side
    assert first["field"].startswith("prompt[") and first["after"] == "[]"


@pytest.mark.parametrize("mode, needle", [
    ("exit", "the server ended (exit 1) before /health answered"),
    ("die:2", "gave no answer to request"),
    ("not_json", "malformed response to request 'pair-0': not JSON"),
    ("drop:choices.0.logprobs", "malformed response to request 'pair-0': no field 'logprobs'"),
    ("drop:usage.prompt_tokens_details", "no field 'usage.prompt_tokens_details.cached_tokens'"),
    ("drop:choices.0.finish_reason", "no field 'finish_reason'"),
])
def test_a_failing_server_is_an_error_cell_naming_what_happened(tmp_path: Path, mode: str, needle: str) -> None:
    row, _ = run_one(tmp_path, mode)
    assert row.status == "error" and "ServerError" in row.error and needle in row.error, row.error
    assert alive(tmp_path) == []


def test_the_error_rows_type_is_the_servers_own_exception(tmp_path: Path) -> None:
    """The server's last exception line ends the error, so ``fails = "error: RuntimeError"`` can declare it."""
    from harness.results.rows import error_type

    row, _ = run_one(tmp_path, "exit")
    assert error_type(row.error) == "RuntimeError" and row.error.endswith("RuntimeError: no such model")
    row, _ = run_one(tmp_path, "unhealthy", start_timeout=1)
    assert error_type(row.error) == "ServerError"


def test_a_killed_server_names_its_last_output(tmp_path: Path) -> None:
    row, _ = run_one(tmp_path, "die:1")
    assert row.status == "error" and "server killed by SIGKILL" in row.error and "out of memory" in row.error, row.error
    assert error_type(row.error) == "SIGKILL", row.error


def test_a_server_killed_by_a_signal_at_start_errs_with_the_signal_as_its_type(tmp_path: Path) -> None:
    """The signal, not an exception line it printed before, is the cause a declaration names (``error: SIGILL``)."""
    row, _ = run_one(tmp_path, "sigill")
    assert row.status == "error" and "the server ended (killed by SIGILL) before /health answered" in row.error
    assert error_type(row.error) == "SIGILL" and "unrelated warning" in row.error, row.error


def test_a_server_that_kills_itself_after_an_exception_errs_with_the_exception_as_its_type(tmp_path: Path) -> None:
    """A kill (not a fault) after a traceback is the server ending itself, as SGLang's launcher SIGKILLs its process
    tree once its scheduler raised: the exception is the cause a declaration names (``error: NotImplementedError``)."""
    row, _ = run_one(tmp_path, "self_kill")
    assert row.status == "error" and "killed by SIGKILL" in row.error, row.error
    assert error_type(row.error) == "NotImplementedError", row.error


def test_a_server_that_never_gets_healthy_is_an_error_within_its_start_timeout(tmp_path: Path) -> None:
    row, seconds = run_one(tmp_path, "unhealthy", start_timeout=2)
    assert row.status == "error" and "did not answer /health within 2 s" in row.error
    assert seconds < 15 and alive(tmp_path) == []


def test_a_hung_server_is_an_error_cell_within_the_cell_timeout(tmp_path: Path) -> None:
    row, seconds = run_one(tmp_path, "hang:2", timeout=4)
    assert row.status == "error" and "timeout of 4 s" in row.error
    assert seconds < 4 + 15 and alive(tmp_path) == []


def test_a_request_may_take_longer_than_a_start(tmp_path: Path) -> None:
    """A request's timeout is its own (default: the cell's timeout): a 3 s answer passes though the server must start
    within 2 s, and [server] request_timeout_s bounds a request that never answers well within the cell's timeout."""
    row, _ = run_one(tmp_path, "late:3", start_timeout=2)
    assert row.status == "pass", row.error
    path = write_matrix(tmp_path, "hang:1", timeout=60)
    path.write_text(path.read_text().replace("start_timeout_s = 20", "start_timeout_s = 20\nrequest_timeout_s = 1"))
    (cell,) = generate(load_matrix(str(path)))
    began = time.perf_counter()
    row = run_cell(load_matrix(str(path)), cell, faults=frozenset(), goldens=GoldenRuns())
    seconds = time.perf_counter() - began
    assert row.status == "error" and "gave no answer to request" in row.error and "timed out" in row.error, row.error
    assert seconds < 30 and alive(tmp_path) == []


#: one cell run as the test's own process would, in a process of its own: a Ctrl-C there is heard by a main thread
#: that no other test has touched (in a test worker it was lost twice in the whole suite, never alone)
RUN_ONE_CELL = """
import faulthandler, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for every thread's stack if it hangs
print("SIGINT at start:", signal.getsignal(signal.SIGINT), "blocked:", signal.pthread_sigmask(signal.SIG_BLOCK, []),
      file=sys.stderr)
from harness.matrix.file import load_matrix
from harness.matrix.model import generate
from harness.run.cell import run_cell
from harness.results.rows import error_type
from harness.run.golden import GoldenRuns
matrix = load_matrix(sys.argv[1])
(cell,) = generate(matrix)
try:
    run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
except KeyboardInterrupt:
    sys.exit(130)
"""


def _sigint_as_a_terminal_sends_it() -> None:
    import signal

    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_mid_pass_leaves_no_server(tmp_path: Path) -> None:
    import signal
    import subprocess

    path = write_matrix(tmp_path, "hang:1")
    hanging = tmp_path / "pids.hanging"  # the stand-in's mark: it holds a request unanswered
    root = FAKE.parents[2]
    # a child inherits its starter's blocked and ignored signals: an earlier test of this worker may have left SIGINT
    # so, and the Ctrl-C would never reach the run (make test saw it run to its end, exit 0); a terminal's does reach it
    run = subprocess.Popen([sys.executable, "-c", RUN_ONE_CELL, str(path)], cwd=root,
                           env={**os.environ, "PYTHONPATH": str(root)}, stderr=subprocess.PIPE, text=True,
                           preexec_fn=_sigint_as_a_terminal_sends_it)
    try:
        deadline = time.monotonic() + 120
        while not hanging.exists():
            assert run.poll() is None and time.monotonic() < deadline, "the pass never reached the hung request"
            time.sleep(0.05)
        run.send_signal(signal.SIGINT)
        try:
            code = run.wait(timeout=60)
        except subprocess.TimeoutExpired:  # where it is stuck, for the next time this flakes
            run.send_signal(signal.SIGUSR1)
            time.sleep(2)
            run.kill()
            err = run.communicate()[1]
            pytest.fail(f"no exit within 60 s of SIGINT (exit {run.returncode} after SIGKILL; 0 means the cell ran on "
                        f"to its end: the interrupt was lost); its threads and its stderr:\n{err[:3000]}\n...\n{err[-3000:]}")
        assert code == 130, run.stderr.read()
    finally:
        run.kill()
    assert alive(tmp_path) == []


PD = """
[server.pd]
handoff = "kv_transfer_params"
request = { max_tokens = 1, kv_transfer_params = { do_remote_decode = true } }

[server.pd.levels.nixl]
prefill = { flags = ["--role=prefill"] }
decode = { flags = ["--role=decode"] }
"""


def run_pd(tmp_path: Path, mode: str) -> object:
    """The ``pd = nixl`` cell of a matrix whose golden is one plain server: a prefill and a decode stand-in."""
    path = write_matrix(tmp_path, mode, extra=PD)
    path.write_text(path.read_text().replace("slots = [1]\n", 'slots = [1]\npd = ["off", "nixl"]\n', 1))
    matrix = load_matrix(str(path))
    (cell,) = [c for c in generate(matrix) if c.as_dict()["pd"] == "nixl"]
    return run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())


def test_a_pd_cell_hands_each_request_from_its_prefill_server_to_its_decode_server(tmp_path: Path) -> None:
    row = run_pd(tmp_path, "ok")
    assert row.status == "pass", row.error
    assert row.oracles["tokens"].status == "pass"
    assert len((tmp_path / "pids").read_text().split()) == 3  # the golden's server, then the pair
    assert alive(tmp_path) == []


def test_a_decode_server_handed_another_requests_parameters_fails_tokens(tmp_path: Path) -> None:
    """The planted handoff fault: each decode request carries the parameters of the request prefilled before it."""
    row = run_pd(tmp_path, "stale_handoff")
    assert row.status == "fail" and row.oracles["tokens"].status == "fail", row.oracles["tokens"].message
    assert alive(tmp_path) == []


def test_a_prefill_answer_without_the_handoff_field_is_an_error_naming_it(tmp_path: Path) -> None:
    row = run_pd(tmp_path, "drop:kv_transfer_params")
    assert row.status == "error" and "on the prefill server: no kv_transfer_params object" in row.error, row.error
    assert alive(tmp_path) == []


def test_a_pd_level_without_its_two_launches_is_refused(tmp_path: Path) -> None:
    path = write_matrix(tmp_path, extra=PD.replace('decode = { flags = ["--role=decode"] }\n', ""))
    path.write_text(path.read_text().replace("slots = [1]\n", 'slots = [1]\npd = ["off", "nixl"]\n', 1))
    with pytest.raises(MatrixError, match=r"\[server.pd.levels.nixl\]: missing or not a table of exactly prefill and decode"):
        load_matrix(str(path))


def test_a_cache_reset_that_never_takes_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM answers ``{"success": false}`` while blocks are held: the next workload's cold pass would not be cold."""
    from harness.sut.openai import engine

    monkeypatch.setattr(engine, "SETTLE_S", 0.5)
    path = write_matrix(tmp_path, "stuck_reset")
    path.write_text(path.read_text().replace('workloads = ["pair"]', 'workloads = ["pair", "split_kv"]'))
    matrix = load_matrix(str(path))
    (cell,) = generate(matrix)
    row = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
    assert row.status == "error" and "/reset did not empty the cache within 0.5 s" in row.error, row.error
    assert alive(tmp_path) == []


def test_a_cache_reset_answered_in_plain_text_takes(tmp_path: Path) -> None:
    """SGLang's /flush_cache answers "Cache flushed." as text with HTTP 200 (400 when it could not): that is a reset,
    where a request's answer that is not JSON still fails (the not_json case above)."""
    path = write_matrix(tmp_path, "text_reset")
    path.write_text(path.read_text().replace('workloads = ["pair"]', 'workloads = ["pair", "split_kv"]'))
    matrix = load_matrix(str(path))
    (cell,) = generate(matrix)
    row = run_cell(matrix, cell, faults=frozenset(), goldens=GoldenRuns())
    assert row.status == "pass", row.error
    assert alive(tmp_path) == []


def test_the_launch_renders_levels_placeholders_and_literal_braces(tmp_path: Path) -> None:
    extra = """
[server.levels.model]
flags = ['--cfg={{"n": {num_draft_tokens}, "slots": {slots}}}']
"""
    matrix = load_matrix(str(write_matrix(tmp_path, extra=extra)))
    (cell,) = generate(matrix)
    launch = Launch(matrix.engine_args, {"num_draft_tokens": 3, **cell.as_dict()}, 8123)
    assert launch.argv[2:4] == ["8123", "ok"]
    assert launch.argv[5] == str(tmp_path / "model")
    assert launch.argv[-2:] == ['--cfg={"n": 3, "slots": 1}', "--slots=1"]  # level entries in factor order


@pytest.mark.parametrize("edit, needle", [
    (("[server]\n", "[server]\nbogus = 1\n"), "[server] bogus: unknown key"),
    (('"{{port}}", ', ""), "[server] command: never names {port}"),
    (("start_timeout_s = {start_timeout}", "start_timeout_s = 5\nrequest_timeout_s = 0"), "request_timeout_s: expected a positive"),
    (('"{{port}}"', '"{{prot}}"'), "unknown placeholder {prot}"),
    (('api = "openai"', 'api = "grpc"'), "unknown api 'grpc'"),
    (('health = "/health"', 'health = "health"'), "is not a URL path"),
    (("[golden]\nslots = 1\n", ""), "[golden] slots: missing"),
    (("[server.levels.slots]\nflags = [\"--slots={{level}}\"]\n", ""), "[factors] slots: the server never sees"),
    (("[server.levels.slots]\nflags", "[server.levels.slots]\n2 = {{}}\nflags"), "neither a level of slots"),
    (("{extra}", "[server.counters]\ndrafts = \"prom x\"\n"), "neither 'metric NAME'"),
    (("{extra}", "[server.counters]\ndrafts = \"metric x_total\"\n"), "names neither accepted_tokens nor verify_steps"),
    (("slots = [1]\n", "slots = [1]\npd = [\"off\", \"nixl\"]\n"), "[factors] pd: levels other than off run"),
    (("{extra}", "[server.pd]\nhandoff = \"h\"\nrequest = {{}}\nlevels = {{}}\n"), "[server.pd]: no [factors] pd"),
    (('api = "openai"', 'api = "openai"\nread_back = "tgi"'), "unknown read-back 'tgi'"),
])
def test_a_bad_server_table_names_the_file_and_key(tmp_path: Path, edit: tuple[str, str], needle: str) -> None:
    path = write_matrix(tmp_path)
    template = MATRIX.replace(*edit)
    model = tmp_path / "model"
    path.write_text(template.format(timeout=60, model=model, python=sys.executable, fake=FAKE, mode="ok",
                                    pids=tmp_path / "pids", start_timeout=20, extra=""))
    with pytest.raises(MatrixError) as caught:
        load_matrix(str(path))
    assert needle in str(caught.value) and "s.toml" in str(caught.value)


def test_engine_args_and_server_tables_belong_to_their_engines(tmp_path: Path) -> None:
    path = write_matrix(tmp_path)
    path.write_text(path.read_text() + "\n[engine_args]\nx = 1\n")
    with pytest.raises(MatrixError, match=r"\[engine_args\]: unknown table of a matrix of engine 'openai' \(known: .*server\)"):
        load_matrix(str(path))
    plain = tmp_path / "r.toml"
    plain.write_text('[matrix]\nname = "r"\nmode = "full"\nworkloads = ["pair"]\n[factors]\ncache = ["off"]\n'
                     '[server]\napi = "openai"\n')
    with pytest.raises(MatrixError, match=r"\[server\]: unknown table of a matrix of engine 'reference'"):
        load_matrix(str(plain))


def test_prometheus_samples_sum_over_label_sets() -> None:
    text = ('# HELP vllm:spec_decode_num_drafts_total drafts\n# TYPE vllm:spec_decode_num_drafts_total counter\n'
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0\n'
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 3.0\n'
            'vllm:spec_decode_num_drafts_created{engine="0"} 1.7e+09\nllamacpp:tokens_predicted_total 40\n')
    sums = metric_sums(text)
    assert sums["vllm:spec_decode_num_drafts_total"] == 15.0 and sums["llamacpp:tokens_predicted_total"] == 40.0
    with pytest.raises(ServerError, match="malformed metrics"):
        metric_sums("vllm:x_total{a=\"b\"} twelve\n")


def test_an_openai_response_becomes_the_oracles_output() -> None:
    doc = {"choices": [{"finish_reason": "length", "logprobs": {
        "tokens": ["token_id:229", "token_id:255"], "token_logprobs": [-1.1, -2.5],
        "top_logprobs": [{"token_id:10": -2.87, "token_id:229": -1.1}, {"token_id:255": -2.5, "token_id:231": -2.8}]}}],
        "usage": {"prompt_tokens_details": {"cached_tokens": 32}}}
    server = {"api": "openai", "cached_tokens": "usage.prompt_tokens_details.cached_tokens", "counters": {}}
    reply = request_output(server, RequestSpec(rid="r", prompt=[1, 2], max_new_tokens=2), doc)
    out, counters = reply.output, reply.counters
    assert out.tokens == [229, 255] and out.top_ids == [[229, 10], [255, 231]]
    assert out.cached_tokens == out.cached_device == 32 and counters == {}
    assert out.margins[0] == pytest.approx(1.77)
    doc["choices"][0]["logprobs"]["tokens"][1] = "ab"
    with pytest.raises(ServerError, match="'ab' is not 'token_id:N'"):
        openai_parse(doc, "to request 'r'")


def test_a_llamacpp_response_becomes_the_oracles_output() -> None:
    doc = {"tokens": [7, 9, 4], "stop_type": "limit", "id_slot": 1,
           "timings": {"cache_n": 4, "draft_n": 6, "draft_n_accepted": 5},
           "completion_probabilities": [
               {"id": 7, "logprob": -0.1, "top_logprobs": [{"id": 7, "logprob": -0.1}, {"id": 3, "logprob": -2.5}]},
               {"id": 9, "logprob": -0.2, "top_logprobs": [{"id": 9, "logprob": -0.2}, {"id": 1, "logprob": -1.5}]},
               {"id": 4, "logprob": 0.0, "top_logprobs": []}]}
    server = {"api": "llamacpp", "cached_tokens": "timings.cache_n",
              "counters": {"draft_tokens": ["response", "timings.draft_n"],
                           "accepted_tokens": ["response", "timings.draft_n_accepted"]}}
    reply = request_output(server, RequestSpec(rid="r", prompt=[1], max_new_tokens=3), doc)
    out, counters = reply.output, reply.counters
    assert out.tokens == [7, 9, 4] and out.finish_reason == "length" and out.cached_tokens == 4
    assert counters == {"draft_tokens": 6, "accepted_tokens": 5}
    # the slot that served it, and the token a verify step emitted (returned without the top logprobs asked)
    assert reply.slot == 1 and reply.verified == (2,)
    with pytest.raises(ServerError, match=r"no field 'id_slot'"):
        request_output(server, RequestSpec(rid="r", prompt=[1], max_new_tokens=3),
                       {k: v for k, v in doc.items() if k != "id_slot"})
    del doc["completion_probabilities"][1]["top_logprobs"][0]["logprob"]
    with pytest.raises(ServerError, match=r"no field '0.logprob'"):
        llamacpp_parse(doc, "to request 'r'")
    assert field_at({"a": [{"b": 2}]}, "a.0.b", int, "x") == 2


def test_a_server_program_that_is_not_here_is_refused_at_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.run.session import check_runnable

    path = write_matrix(tmp_path)
    check_runnable(load_matrix(str(path)), "cpu")
    path.write_text(path.read_text().replace(f'command = ["{sys.executable}"', 'command = ["/nowhere/server"'))
    with pytest.raises(MatrixError, match=r"s.toml: \[server\] command: no program '/nowhere/server'"):
        check_runnable(load_matrix(str(path)), "cpu")
    path.write_text(path.read_text().replace('command = ["/nowhere/server"', 'command = ["{llama_server}"'))
    monkeypatch.setenv("KVMATRIX_LLAMA_SERVER", str(tmp_path / "none"))
    with pytest.raises(MatrixError, match=r"no llama-server at .*none \(make llama-server"):
        check_runnable(load_matrix(str(path)), "cpu")
