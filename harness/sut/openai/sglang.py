"""SGLang's server (``read_back = "sglang"``, its api's own): what it applied, and the rule its radix cache is judged by.

What was asked is read from the launch (SGLang's own flags, whose argparse names are its ``ServerArgs`` fields); what
it applied is ``GET /server_info``: every ``ServerArgs`` field as SGLang resolved it (``server_args.resolved_dict``:
its post-process passes, ``arg_groups/``, may change what the launch asked, each logging a warning). A change SGLang's
source documents (``RULES``) is shown with its citation and the cell is judged by what SGLang applied; any other change
of a setting the cell tests defeats it (``FIELDS``).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from harness.sut.base import Applied, Traits
from harness.sut.host import cpu_flags
from harness.sut.openai.launch import flag_value
from harness.sut.openai.wire import ServerError
from harness.sut.rules import PagedPrefixCache

if TYPE_CHECKING:
    from harness.sut.openai.launch import Launch
    from harness.sut.openai.server import ServerProcess

SERVER_INFO = "/server_info"


@dataclass(frozen=True, slots=True)
class Field:
    """A ``ServerArgs`` field read back: how its flag's value reads (None: a switch, absent = False), and why SGLang
    applying another value defeats the cell ("" where the cell is judged by the value applied)."""

    read: Callable[[str], object] | None
    defeats: str = ""


FIELDS: Mapping[str, Field] = {
    "page_size": Field(int),
    "chunked_prefill_size": Field(int),
    "max_running_requests": Field(int),
    "disable_radix_cache": Field(None, "the cell tests the radix cache and SGLang turned it off"),
    "enable_hierarchical_cache": Field(None, "the cell tests the host tier and SGLang ran without it"),
    "attention_backend": Field(str, "the cell tests this attention backend and SGLang ran another"),
    "kv_cache_dtype": Field(str, "the cell tests a KV cache dtype SGLang did not use"),
    "dtype": Field(str, "the cell tests a model dtype SGLang did not use"),
    "enable_deterministic_inference": Field(None, "the cell tests deterministic inference and SGLang ran without it"),
    "speculative_algorithm": Field(str, "the cell tests this proposer and SGLang ran another"),
    "speculative_num_draft_tokens": Field(int, "the cell tests this draft length and SGLang drafts another"),
    "speculative_num_steps": Field(int, "the cell tests this draft length and SGLang drafts another"),
}

#: the attention backends that keep the radix cache under deterministic inference (SGLang 0.5.23,
#: ``arg_groups/attention_hook.py``: RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND)
RADIX_DETERMINISTIC = ("fa3", "fa4", "triton")


@dataclass(frozen=True, slots=True)
class Rule:
    """A change SGLang makes to a field by a rule its source states: when it applies (asked, resolved, the CPU flags
    of the host the server runs on: the harness's own, a server being local), and where."""

    field: str
    applies: Callable[[Mapping[str, object], Mapping[str, object], frozenset[str]], bool]
    cite: str


RULES = (
    Rule("disable_radix_cache",
         lambda asked, used, flags: bool(used.get("enable_deterministic_inference"))
         and used.get("attention_backend") not in RADIX_DETERMINISTIC,
         "SGLang keeps no radix cache under deterministic inference on this backend (arg_groups/attention_hook.py, "
         "_handle_deterministic_inference)"),
    # SGLang asks torch (torch.cpu._is_amx_tile_supported, utils/common.py cpu_has_amx_support): on a host whose CPU
    # has amx_tile the same change is no fallback and defeats the cell
    Rule("attention_backend",
         lambda asked, used, flags: asked.get("attention_backend") == "intel_amx" and used.get("device") == "cpu"
         and used.get("attention_backend") == "torch_native" and "amx_tile" not in flags,
         "SGLang runs torch_native for intel_amx on a CPU without AMX, as this host's is (arg_groups/overrides.py, "
         "_attention_backend_platform_fallbacks)"),
)

#: how SGLang's radix cache grants hits, in the shared paged rule's terms
RADIX = PagedPrefixCache(name=(
    "SGLang radix cache: the prompt's longest cached prefix less its last token, cut to whole pages "
    "(managers/schedule_batch.py _compute_max_prefix_len; mem_cache/radix_cache.py match_prefix); finished "
    "requests' prompts and outputs are inserted (cache_finished_req)"))


def asked(argv: Sequence[str]) -> dict[str, object]:
    """The ``ServerArgs`` fields of ``FIELDS`` the launch sets (the last of a repeated flag wins, as argparse has it);
    a switch the launch leaves out is False."""
    arguments: dict[str, object] = {name: False for name, f in FIELDS.items() if f.read is None}
    for i, arg in enumerate(argv):
        flag = arg.partition("=")[0]
        name = flag.removeprefix("--").replace("-", "_")
        if not flag.startswith("--") or name not in FIELDS:
            continue
        read = FIELDS[name].read
        arguments[name] = True if read is None else flag_value(argv, i, read)
    return arguments


def read_back(arguments: Mapping[str, object], info: Mapping[str, object],
              flags: frozenset[str] | None = None) -> tuple[Applied, ...]:
    """What SGLang applied of ``arguments``, field by field from ``/server_info``; a change a rule of ``RULES``
    explains on a host with CPU ``flags`` (this machine's by default) carries its citation and defeats nothing."""
    flags = cpu_flags() if flags is None else flags
    missing = sorted(name for name in {*arguments, "page_size"} if name not in info)
    if missing:
        raise ServerError(f"malformed response to GET {SERVER_INFO}: no {', '.join(missing)}")
    found = []
    for name, value in arguments.items():
        used = info[name]
        rule = next((r.cite for r in RULES if r.field == name and value != used and r.applies(arguments, info, flags)), "")
        found.append(Applied(name, value, used, "" if rule or value == used else FIELDS[name].defeats, rule))
    return tuple(found)


def judged_traits(traits: Traits, argv: Sequence[str], info: Mapping[str, object],
                  flags: frozenset[str] | None = None) -> Traits:
    """``traits`` as SGLang applied them on a host with CPU ``flags`` (this machine's by default): its radix cache on
    or off and its page size as resolved, judged by SGLang's rule, every setting read back beside the launch's."""
    applied = read_back(asked(argv), info, flags)
    used = {setting.what: setting.used for setting in applied}
    page_size = int(info["page_size"])
    cache = replace(traits.cache, enabled=not used["disable_radix_cache"], page_size=page_size, chunk_size=page_size,
                    state_interval=page_size, rule=RADIX)
    return replace(traits, cache=cache, applied=applied)


def read_traits(process: ServerProcess, launch: Launch, traits: Traits, timeout_s: float) -> Traits:
    """``traits`` as a healthy SGLang server applied them (``judged_traits``), read from ``/server_info``."""
    info = process.call(SERVER_INFO, None, timeout_s, f"to GET {SERVER_INFO}")
    if not isinstance(info, dict):
        raise ServerError(f"malformed response to GET {SERVER_INFO}: {str(info)[:120]}")
    return judged_traits(traits, launch.argv, info)
