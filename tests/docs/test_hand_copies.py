"""The docs' hand-written copies of what the code declares name exactly what the code declares.

Each test reads one registry or declaration from the code and the names a page lists for it, and compares the two
sets, so the prose around the names stays hand-written while a name added, renamed or removed in the code fails here
until the page says so too. (The tables the code prints whole are generated blocks instead: ``test_docs.py``.)
"""
from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import pytest

from harness import oracles, pytest_plugin
from harness.cli.main import build_parser
from harness.oracles.view import REFERENCES

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ROOT / "docs/reference/commands.md"
LAYOUT = ROOT / "docs/explanation/layout.md"
ORACLES = ROOT / "docs/reference/oracles.md"
_OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")
_ENV = re.compile(r"\bKVMATRIX_[A-Z0-9_]+")


def section(text: str, heading: str) -> str:
    """The body of the Markdown section under ``heading`` (a whole heading line), up to the next heading of any
    level."""
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    following = re.search(r"^#{1,6} ", text[start:], re.M)
    return text[start:start + following.start()] if following else text[start:]


def first_column(text: str, header: str) -> list[str]:
    """The first cell of every row of the Markdown table whose header row starts with ``| header |``."""
    rows = text[text.index(f"| {header} |"):].splitlines()
    cells = []
    for row in rows[2:]:
        if not row.startswith("|"):
            break
        cells.append(row.split("|")[1].strip())
    return cells


def listed(text: str, lead: str) -> set[str]:
    """The names listed after ``lead`` in ``text`` up to the closing parenthesis (line breaks ignored): both
    ``lead (a, b.py, c)`` and ``(lead: a, b.py, c)`` give ``{"a", "b", "c"}``."""
    match = re.search(re.escape(lead) + r"[\s:(]*([^)]*)\)", " ".join(text.split()))
    assert match, f"no list after {lead!r}"
    return {name.strip().removesuffix(".py") for name in match.group(1).split(",") if name.strip()}


def test_the_oracle_pages_reference_table_names_every_reference_an_oracle_may_read() -> None:
    named = {cell.strip("`") for cell in first_column(ORACLES.read_text(), "reference")}
    references = set(REFERENCES)
    assert named == references, (f"docs/reference/oracles.md's references table vs harness/oracles/view.py "
                                 f"REFERENCES: missing {references - named}, not in the code {named - references}")


def test_every_built_in_oracle_is_seen_to_fail() -> None:
    table = section(ORACLES.read_text(), "## Each check is seen to fail")
    named = {name for cell in first_column(table, "oracle: check")
             for name in re.findall(r"`(\w+)`", cell.split(":")[0])}
    builtin = {oracle.name for oracle in oracles.BUILTIN}
    assert named - {"error"} == builtin, (f"docs/reference/oracles.md's 'seen to fail' table vs oracles.BUILTIN: "
                                          f"no row for {builtin - named}, not an oracle {named - builtin - {'error'}}")


def test_the_layout_page_names_every_built_in_oracle_module() -> None:
    modules = {oracle.judge.__module__.rpartition(".")[2] for oracle in oracles.BUILTIN}
    named = listed(LAYOUT.read_text(), "one module per oracle")
    assert named == modules, (f"docs/explanation/layout.md's oracle list vs harness/oracles BUILTIN: missing "
                              f"{modules - named}, not in the code {named - modules}")


def test_the_layout_page_names_every_script_writer() -> None:
    from harness import sut

    named, writers = listed(LAYOUT.read_text(), "the programs with a script writer"), set(sut.script_writers())
    assert named == writers, (f"docs/explanation/layout.md's script writers vs the engines' Engine.writers: "
                              f"missing {writers - named}, not in the code {named - writers}")


def synopsis() -> dict[str, set[str]]:
    """Each ``python -m harness`` subcommand in the commands page's first code block, with the options its lines
    name (comments left out)."""
    block = re.search(r"```sh\n(.*?)```", COMMANDS.read_text(), re.S).group(1)
    commands: dict[str, set[str]] = {}
    name = ""
    for line in block.splitlines():
        code = line.split(" #", 1)[0]
        start = re.match(r"python -m harness (\w+)", code)
        if start:
            name = start.group(1)
            commands[name] = set()
            code = code[start.end():]
        commands[name] |= set(_OPTION.findall(code))
    return commands


def subcommands() -> dict[str, list[list[str]]]:
    """Each subcommand of the CLI's parser with the option strings of each of its options (``-h`` left out)."""
    parser = build_parser()
    action = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return {name: [option.option_strings for option in sub._actions
                   if option.option_strings and not isinstance(option, argparse._HelpAction)]
            for name, sub in action.choices.items()}


def disagreement(doc: set[str], code: list[list[str]]) -> list[str]:
    """What a page's option names and a parser's options disagree on: an option the page names by none of its
    spellings, and a name on the page that is no option's."""
    missing = [" / ".join(strings) for strings in code if not doc & set(strings)]
    unknown = sorted(doc - {string for strings in code for string in strings})
    return [f"missing {name}" for name in missing] + [f"not an option: {name}" for name in unknown]


def test_the_command_synopsis_names_every_subcommand_and_option() -> None:
    doc, code = synopsis(), subcommands()
    assert set(doc) == set(code), f"docs/reference/commands.md's synopsis vs harness/cli: {set(doc) ^ set(code)}"
    wrong = {name: problems for name in code if (problems := disagreement(doc[name], code[name]))}
    assert not wrong, f"docs/reference/commands.md's synopsis vs harness/cli's parser: {wrong}"


def test_the_run_option_table_names_every_option_of_harness_run() -> None:
    table = section(COMMANDS.read_text(), "## `run`")
    named = {_OPTION.match(cell.strip("`")).group(1) for cell in first_column(table, "option")}
    wrong = disagreement(named | {"--matrix"}, subcommands()["run"])
    assert not wrong, f"docs/reference/commands.md's `run` table vs harness/cli's parser: {wrong}"


def plugin_options() -> set[str]:
    """The options the pytest plugin declares, as its ``pytest_addoption`` declares them."""
    declared: set[str] = set()

    class Parser:
        def getgroup(self, *args: object) -> Parser:
            return self

        def addoption(self, flag: str, **kwargs: object) -> None:
            declared.add(flag)

    pytest_plugin.pytest_addoption(Parser())
    return declared


def test_the_pytest_option_table_names_every_option_of_the_plugin() -> None:
    table = section(COMMANDS.read_text(), "## pytest")
    named = {_OPTION.match(cell.strip("`")).group(1) for cell in first_column(table, "option (group `kvmatrix`)")}
    declared = plugin_options()
    assert named == declared, (f"docs/reference/commands.md's pytest options vs the plugin's: missing "
                               f"{declared - named}, not an option {named - declared}")


def test_the_marker_table_names_every_registered_marker() -> None:
    table = section(COMMANDS.read_text(), "## pytest")
    named = {cell.strip("`") for cell in first_column(table, "marker")}
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {line.split(":", 1)[0] for line in config["markers"]}
    assert named == registered, (f"docs/reference/commands.md's markers vs pyproject.toml: missing "
                                 f"{registered - named}, not registered {named - registered}")


def test_the_make_table_names_every_target() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.search(r"^\.PHONY:(.*)$", makefile, re.M).group(1).split())
    named = {cell.strip("`").removeprefix("make ") for cell in first_column(section(COMMANDS.read_text(), "## make"),
                                                                             "target")}
    assert named == targets, (f"docs/reference/commands.md's make targets vs the Makefile's .PHONY: missing "
                              f"{targets - named}, not a target {named - targets}")


def test_the_environment_table_names_every_variable_the_code_reads() -> None:
    read = {name for package in ("harness", "reference_impl", "fixtures", "reports")
            for path in (ROOT / package).rglob("*.py") for name in _ENV.findall(path.read_text())}
    named = {name for cell in first_column(section(COMMANDS.read_text(), "## Environment"), "variable")
             for name in _ENV.findall(cell)}
    assert named == read, (f"docs/reference/commands.md's environment table vs the code: missing {read - named}, "
                           f"read nowhere {named - read}")


def test_every_benchmark_script_has_its_place_in_benchmarks() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    scripts = sorted(path.name for path in (ROOT / "benchmarks").iterdir() if path.suffix in (".py", ".toml"))
    unnamed = [name for name in scripts if name not in text]
    assert not unnamed, f"BENCHMARKS.md names no section's command for {unnamed}: add its table there"


@pytest.mark.parametrize(("doc", "code", "problems"), [
    ({"--cell", "-j"}, [["--cell"], ["-j", "--jobs"]], []),
    ({"--cell"}, [["--cell"], ["-j", "--jobs"]], ["missing -j / --jobs"]),
    ({"--cell", "--gone", "-j"}, [["--cell"], ["-j", "--jobs"]], ["not an option: --gone"]),
])
def test_disagreement_names_a_missing_option_and_a_stale_one(doc: set[str], code: list[list[str]],
                                                             problems: list[str]) -> None:
    assert disagreement(doc, code) == problems


def test_listed_reads_a_wrapped_list() -> None:
    assert listed("oracles/ one module per oracle (tokens,\n   logprobs, pd_audit.py); view.py (the view)",
                  "one module per oracle") == {"tokens", "logprobs", "pd_audit"}
    assert listed("scripts/ (one writer per engine: reference.py,\n vllm.py), standalone/ (checks)",
                  "one writer per engine") == {"reference", "vllm"}
