"""The ``[server]`` table of an ``engine = "openai"`` matrix: how to launch, drive and read an HTTP server.

A server is a black box the file describes: its launch command (a template over the cell's levels), the
wire format it speaks (``api``), where its health, metrics and cache reset live, and where each measurement
comes from. Each factor of the matrix is either one the oracles read (``MEANING_FACTORS``: the model, its
cache, its proposer …) or one of the server's own (slots, flash attention …); either way
``[server.levels.FACTOR]`` says what its level adds to the launch (``flags``, ``env``) or to every
request (``request``), once for every level (``{level}`` in the strings) or level by level::

    [server.levels.slots]
    flags = ["-np", "{level}"]

    [server.levels.cache]
    off = { request = { cache_prompt = false } }
    device = { request = { cache_prompt = true } }

A level that chooses one of the server's kernel paths names the CPU flags that path needs (``cpu``): on a host
without them the matrix is refused when it loads, naming the missing flag (``needs_cpu``), never run into failures::

    [server.levels.cpu_kernels]
    amx = { cpu = ["amx_tile"] }
    plain = { flags = ["--no-repack"] }

A ``pd`` factor's levels other than ``off`` run two servers, a prefill one and a decode one, each launched with
the command plus its role's additions, and hand every request from one to the other as vLLM's toy proxy does: the
prefill server gets the request with ``[server.pd] request`` over it (one token, "keep the KV for a remote
decode"), and the decode server the request with the prefill answer's ``handoff`` field added::

    [server.pd]
    handoff = "kv_transfer_params"
    request = { max_tokens = 1, kv_transfer_params = { do_remote_decode = true, do_remote_prefill = false } }
    [server.pd.levels.nixl]
    prefill = { flags = ['--kv-transfer-config={{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}}'] }
    decode = { flags = ['--kv-transfer-config={{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}}'] }

``read_back`` names how a healthy server is read back (``harness.sut.openai.engine.READ_BACK``: what it applied and
the rules its cells are judged by); the api's own where there is one (llama.cpp's, SGLang's), else nothing is read back.

Strings may name ``{host}``, ``{port}``, ``{side_port}`` (a second free port per server), any factor's level (``{num_draft_tokens}``) and the artefacts made
here (``PLACEHOLDERS``). Every key is checked when the file loads; the table then travels to the cell as a
plain, JSON-able value (the matrix's engine arguments).
"""
from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from harness.sut.host import KERNEL_FLAGS
from harness.sut.levels import EngineLevels, TableError

#: wire formats the harness speaks (harness.sut.openai.wire.API): OpenAI completions (vLLM's, SGLang's
#: /v1/completions), llama.cpp's /completion, SGLang's native /generate.
APIS = ("openai", "llamacpp", "sglang")
#: where each api reports a request's cached prompt tokens, unless ``cached_tokens`` says otherwise.
CACHED_TOKENS = {"openai": "usage.prompt_tokens_details.cached_tokens", "llamacpp": "timings.cache_n",
                 "sglang": "meta_info.cached_tokens"}
DEFAULT_ENDPOINT = {"openai": "/v1/completions", "llamacpp": "/completion", "sglang": "/generate"}
#: the speculative counters a pass is judged by (harness.oracles.accept_length.pass_accept_length): drafts made,
#: draft tokens proposed, draft tokens accepted; or, as SGLang counts, verify steps alone (its accept length
#: is generated tokens / verify steps: drafts = verify steps, accepted = generated - verify steps).
COUNTERS = ("drafts", "draft_tokens", "accepted_tokens", "verify_steps")
#: a counter's source: ``metric NAME`` (a Prometheus counter on ``metrics``, its delta over the pass, summed
#: over label sets) or ``response PATH`` (a number in each response, summed over the pass's requests).
SOURCES = ("metric", "response")
#: artefacts a template may name, made on first use: checkpoints (harness.models.checkpoints), their GGUF
#: (harness.models.gguf_export), and the interpreters and binaries this project builds.
PLACEHOLDERS = ("checkpoint", "gguf", "draft_checkpoint", "draft_gguf", "eagle_checkpoint",
                "sglang_eagle_checkpoint", "vllm_python", "sglang_python", "llama_server", "root")
#: the placeholders that stand for the cell's ``model`` level (its checkpoint, its GGUF).
MODEL_PLACEHOLDERS = ("checkpoint", "gguf")
#: placeholders every cell has.
CELL_PLACEHOLDERS = ("host", "port", "side_port")
#: how a server may be read back after it starts (harness.sut.openai.engine.READ_BACK), and the api whose own it is.
READ_BACKS = {"llamacpp": "llamacpp", "sglang": "sglang", "vllm": None}
#: the factor whose levels other than ``off`` run a prefill server and a decode server (``[server.pd]``).
PD_FACTOR = "pd"
PD_ROLES = ("prefill", "decode")
PD_KEYS = ("handoff", "request", "levels")
LEVEL_KEYS = ("flags", "env", "request", "cpu")
SERVER_KEYS = ("name", "api", "command", "env", "health", "endpoint", "metrics", "reset", "request", "model_name",
               "priority", "cached_tokens", "counters", "levels", "pd", "read_back", "start_timeout_s", "request_timeout_s")


def parse_tables(levels: EngineLevels, doc: Mapping[str, object], factors: Mapping[str, tuple[object, ...]],
                 golden: Mapping[str, object]) -> Mapping[str, object]:
    """An openai matrix's engine arguments: its ``[server]`` table. Each of the server's own factors needs a
    ``[golden]`` level, since no defaults table knows it."""
    for factor, choices in factors.items():
        if factor in golden or factor in levels.kept_from_cell:
            continue
        if factor not in levels.defaults:
            raise TableError(f"[golden] {factor}", "missing: name the golden level of each of the server's own "
                             "factors (no defaults table knows them)")
        default = levels.defaults[factor]
        if not any(type(default) is type(level) and default == level for level in choices):
            raise TableError(f"[golden] {factor}", f"missing: the default golden level {default!r} is not one of "
                             f"[factors] {factor} ({', '.join(map(str, choices))}); name the one the golden cell runs")
    return MappingProxyType(parse_server(doc.get("server"), factors, tuple(levels.defaults),
                                         float(doc["matrix"]["timeout_s"])))


def parse_server(table: object, factors: Mapping[str, Sequence[object]], defaulted: Sequence[str],
                 cell_timeout_s: float) -> dict:
    """The validated ``[server]`` table as a plain dict over the matrix's ``factors`` (and the ``defaulted`` ones
    every cell has a level of), each factor of the matrix changing something the server sees (a level entry or
    a placeholder): a factor that changes nothing would be tested as if it did. Its command or environment names
    ``{port}``: the server must listen where the harness looks. A request's timeout is the cell's unless
    ``request_timeout_s`` says otherwise; ``start_timeout_s`` bounds the start alone."""
    if not isinstance(table, dict):
        raise TableError("[server]", "missing: an openai matrix says how to launch its server")
    where = "[server]"
    for key in table:
        if key not in SERVER_KEYS:
            raise TableError(f"{where} {key}", f"unknown key (known: {', '.join(SERVER_KEYS)})")
    for key in ("api", "command", "health"):
        if key not in table:
            raise TableError(f"{where} {key}", "missing required key")
    api = _string(f"{where} api", table["api"])
    if api not in APIS:
        raise TableError(f"{where} api", f"unknown api {api!r} (apis: {', '.join(APIS)})")
    names = list(dict.fromkeys([*factors, *defaulted, *CELL_PLACEHOLDERS, *PLACEHOLDERS]))
    command = _strings(f"{where} command", table["command"], names)
    if not command:
        raise TableError(f"{where} command", "empty")
    env = _env(f"{where} env", table.get("env", {}), names)
    if not any("port" in placeholders(text) for text in [*command, *env.values()]):
        raise TableError(f"{where} command", "never names {port} (nor does [server] env): the server must listen on "
                         "the port the harness gives each cell, e.g. \"--port\", \"{port}\"")
    server = {
        "name": _string(f"{where} name", table.get("name", api)),
        "api": api,
        "command": command,
        "env": env,
        "health": _url_path(f"{where} health", table["health"]),
        "endpoint": _url_path(f"{where} endpoint", table.get("endpoint", DEFAULT_ENDPOINT[api])),
        "metrics": _url_path(f"{where} metrics", table.get("metrics", "/metrics")),
        "reset": _url_path(f"{where} reset", table["reset"]) if "reset" in table else None,
        "request": _request(f"{where} request", table.get("request", {})),
        "model_name": _string(f"{where} model_name", table.get("model_name", "kvmatrix")),
        "priority": _string(f"{where} priority", table["priority"]) if "priority" in table else None,
        "cached_tokens": _string(f"{where} cached_tokens", table.get("cached_tokens", CACHED_TOKENS[api])),
        "counters": _counters(f"{where} counters", table.get("counters", {})),
        "start_timeout_s": _seconds(f"{where} start_timeout_s", table.get("start_timeout_s", 300)),
        "request_timeout_s": _seconds(f"{where} request_timeout_s", table.get("request_timeout_s", cell_timeout_s)),
        "levels": _levels(table.get("levels", {}), factors, names),
        "pd": _pd(table.get("pd"), factors, names),
        "read_back": _read_back(table.get("read_back"), api),
    }
    used = {name for text in _all_strings(server) for name in placeholders(text)}
    if server["pd"] is not None:
        used.add(PD_FACTOR)
    if used & set(MODEL_PLACEHOLDERS):
        used.add("model")
    for factor in factors:
        if factor not in server["levels"] and factor not in used:
            raise TableError(f"[factors] {factor}", "the server never sees this factor: give it a "
                               f"[server.levels.{factor}] entry or name {{{factor}}} in [server] command")
    return server


def needs_cpu(server: Mapping[str, object]) -> dict[str, dict[str, frozenset[str]]]:
    """factor → level → the CPU flags the parsed ``server`` table says that level's kernel path needs."""
    return {factor: {level: frozenset(entry["cpu"]) for level, entry in entries.items() if "cpu" in entry}
            for factor, entries in server["levels"].items()}


def placeholders(text: str) -> list[str]:
    """The placeholder names of a template string (``{port}``; ``{{`` is a literal brace)."""
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


def _template(key: str, text: object, names: Sequence[str], level: bool = False) -> str:
    text = _string(key, text)
    try:
        fields = placeholders(text)
    except ValueError as exc:
        raise TableError(key, f"bad template {text!r}: {exc} (write a literal brace as {{{{ or }}}})") from exc
    allowed = [*names, "level"] if level else names
    for name in fields:
        if name not in allowed:
            raise TableError(key, f"unknown placeholder {{{name}}} in {text!r} (known: {', '.join(allowed)})")
    return text


def _string(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise TableError(key, f"expected a string, got {type(value).__name__} {value!r}")
    return value


def _strings(key: str, value: object, names: Sequence[str], level: bool = False) -> list[str]:
    if not isinstance(value, list):
        raise TableError(key, f"expected a list of strings, got {type(value).__name__} {value!r}")
    return [_template(key, item, names, level) for item in value]


def _env(key: str, value: object, names: Sequence[str], level: bool = False) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TableError(key, f"expected a table of NAME = \"value\", got {type(value).__name__}")
    return {name: _template(f"{key}.{name}", text, names, level) for name, text in value.items()}


def _request(key: str, value: object) -> dict:
    if not isinstance(value, dict):
        raise TableError(key, f"expected a table of request fields, got {type(value).__name__}")
    return dict(value)


def _url_path(key: str, value: object) -> str:
    text = _string(key, value)
    if not text.startswith("/"):
        raise TableError(key, f"{text!r} is not a URL path (it starts with '/': the host and port are the cell's)")
    return text


def _seconds(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise TableError(key, f"expected a positive number of seconds, got {value!r}")
    return float(value)


def _counters(key: str, value: object) -> dict[str, list[str]]:
    if not isinstance(value, dict):
        raise TableError(key, "expected a table of counter = \"metric NAME\" or \"response PATH\"")
    counters = {}
    for name, source in value.items():
        if name not in COUNTERS:
            raise TableError(f"{key}.{name}", f"unknown counter (counters: {', '.join(COUNTERS)})")
        kind, _, where = _string(f"{key}.{name}", source).partition(" ")
        if kind not in SOURCES or not where.strip():
            raise TableError(f"{key}.{name}", f"{source!r} is neither 'metric NAME' nor 'response PATH'")
        counters[name] = [kind, where.strip()]
    if counters and "accepted_tokens" not in counters and "verify_steps" not in counters:
        raise TableError(key, "names neither accepted_tokens nor verify_steps (the accept length is "
                           "judged from one of them)")
    if "verify_steps" in counters and counters.keys() & {"drafts", "accepted_tokens"}:
        raise TableError(key, "verify_steps stands for drafts and accepted_tokens: name it or them, not both")
    return counters


def _levels(table: object, factors: Mapping[str, Sequence[object]], names: Sequence[str]) -> dict:
    """``[server.levels]``: factor → level token → {flags, env, request}, every level of the matrix filled in."""
    if not isinstance(table, dict):
        raise TableError("[server.levels]", "expected a table of factor tables")
    out = {}
    for factor, entry in table.items():
        key = f"[server.levels.{factor}]"
        if factor not in factors:
            raise TableError(key, f"factor {factor!r} is not in [factors] (factors: {', '.join(factors)})")
        if not isinstance(entry, dict):
            raise TableError(key, f"expected a table, got {type(entry).__name__}")
        by_name = {str(level): level for level in factors[factor]}
        if set(entry) <= set(LEVEL_KEYS):  # one entry for every level, {level} in its strings
            out[factor] = {name: _level_entry(key, entry, names, True) for name in by_name}
            continue
        for name in entry:
            if name not in by_name:
                raise TableError(f"{key} {name}", f"neither a level of {factor} ({', '.join(by_name)}) "
                                   f"nor one of {', '.join(LEVEL_KEYS)}")
        missing = [name for name in by_name if name not in entry]
        if missing:
            raise TableError(key, f"no entry for level(s) {', '.join(missing)} (an empty one is {{}})")
        out[factor] = {name: _level_entry(f"{key} {name}", entry[name], names, True) for name in by_name}
    return out


def _read_back(value: object, api: str) -> str | None:
    """How the server is read back: as named, else its api's own (llama.cpp's), else None."""
    if value is None:
        return next((name for name, own in READ_BACKS.items() if own == api), None)
    name = _string("[server] read_back", value)
    if name not in READ_BACKS:
        raise TableError("[server] read_back", f"unknown read-back {name!r} (known: {', '.join(READ_BACKS)})")
    return name


def _pd(table: object, factors: Mapping[str, Sequence[object]], names: Sequence[str]) -> dict | None:
    """``[server.pd]``: the handoff field, the prefill request's fields, and each ``pd`` level's two launches; None
    without it (then a ``pd`` factor has nothing to run and is refused)."""
    levels = [str(level) for level in factors.get(PD_FACTOR, ())]
    if table is None:
        if any(level != "off" for level in levels):
            raise TableError(f"[factors] {PD_FACTOR}", "levels other than off run a prefill and a decode server: "
                             "say how in [server.pd] (handoff, request, levels)")
        return None
    key = "[server.pd]"
    if not isinstance(table, dict):
        raise TableError(key, f"expected a table of {', '.join(PD_KEYS)}, got {type(table).__name__}")
    for name in table:
        if name not in PD_KEYS:
            raise TableError(f"{key} {name}", f"unknown key (known: {', '.join(PD_KEYS)})")
    for name in PD_KEYS:
        if name not in table:
            raise TableError(f"{key} {name}", "missing required key")
    if not levels:
        raise TableError(key, f"no [factors] {PD_FACTOR}: name its levels (off and those [server.pd.levels] runs)")
    launches = table["levels"]
    if not isinstance(launches, dict):
        raise TableError(f"{key} levels", f"expected a table of pd levels, got {type(launches).__name__}")
    out = {}
    for level in levels:
        if level == "off":
            continue
        entry = launches.get(level)
        where = f"[server.pd.levels.{level}]"
        if not isinstance(entry, dict) or set(entry) != set(PD_ROLES):
            raise TableError(where, f"missing or not a table of exactly {' and '.join(PD_ROLES)} (each a table of "
                             f"{', '.join(LEVEL_KEYS)})")
        out[level] = {role: _level_entry(f"{where} {role}", entry[role], names, False) for role in PD_ROLES}
    for level in launches:
        if level not in out:
            raise TableError(f"[server.pd.levels.{level}]", f"not a level of [factors] {PD_FACTOR} other than off "
                             f"({', '.join(levels)})")
    return {"handoff": _string(f"{key} handoff", table["handoff"]),
            "request": _request(f"{key} request", table["request"]), "levels": out}


def _level_entry(key: str, entry: object, names: Sequence[str], level: bool) -> dict:
    if not isinstance(entry, dict):
        raise TableError(key, f"expected a table of {', '.join(LEVEL_KEYS)}, got {type(entry).__name__}")
    for name in entry:
        if name not in LEVEL_KEYS:
            raise TableError(f"{key}.{name}", f"unknown key (known: {', '.join(LEVEL_KEYS)})")
    parsed = {"flags": _strings(f"{key}.flags", entry.get("flags", []), names, level),
              "env": _env(f"{key}.env", entry.get("env", {}), names, level),
              "request": _request(f"{key}.request", entry.get("request", {}))}
    if "cpu" in entry:
        if not level:
            raise TableError(f"{key}.cpu", "a pd role cannot need CPU flags: give them to the pd level's factor entry")
        parsed["cpu"] = _cpu(f"{key}.cpu", entry["cpu"])
    return parsed


def _cpu(key: str, value: object) -> list[str]:
    """A level's ``cpu``: the CPU flags its kernel path needs (``harness.sut.host.KERNEL_FLAGS``), sorted."""
    if not isinstance(value, list) or not value or not all(isinstance(flag, str) for flag in value):
        raise TableError(key, f"expected a non-empty list of CPU flags, got {value!r}")
    unknown = [flag for flag in value if flag not in KERNEL_FLAGS]
    if unknown:
        raise TableError(key, f"{', '.join(map(repr, unknown))} is not a CPU flag kernels choose their path by "
                              f"({', '.join(KERNEL_FLAGS)})")
    return sorted(set(value))


def _all_strings(value: object) -> list[str]:
    """Every string in a parsed server table (to find the placeholders it uses)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _all_strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _all_strings(item)]
    return []
