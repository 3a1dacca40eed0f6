"""The package layout: reference_impl's and harness's sub-packages each stack one way, reports/ only renders.

Read from the source with ``ast`` (every import statement, including those inside functions),
so a cycle or a reach into another package's private names fails here, not in a reader's head.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import fields
from pathlib import Path, PurePosixPath

import pytest

from reference_impl import registry

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "reference_impl"
#: the cross-cutting modules every layer may use; everything else lives in a sub-package.
ROOT_MODULES = {"config", "request", "faults", "registry"}
#: the project's own top-level packages that reference_impl must never import.
ABOVE = {"harness", "fixtures", "reports", "tests", "benchmarks"}


def module_name(path: Path) -> str:
    """``reference_impl/cache/radix.py`` → ``reference_impl.cache.radix`` (a package's ``__init__`` is the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import in ``path``, resolved to absolute names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [alias.name for alias in node.names]
            yield base, names, node.lineno
            for name in names:  # ``from pkg import module`` imports the module too
                yield f"{base}.{name}", [], node.lineno


def unit(module: str) -> str:
    """The layer a module belongs to: its sub-package, or ``root`` for the cross-cutting modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] not in ROOT_MODULES) else "root"


def source_files(package: str = PACKAGE) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def package_graph() -> dict[str, set[str]]:
    """Layer → layers it imports (its own excluded)."""
    known = {module_name(p) for p in source_files()}
    graph: dict[str, set[str]] = {}
    for path in source_files():
        here = unit(module_name(path))
        graph.setdefault(here, set())
        for target, _, _ in imports(path):
            if target in known and unit(target) != here:
                graph[here].add(unit(target))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in ``graph`` as a node path (first node repeated at the end), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_sees_a_cycle_and_accepts_a_stack() -> None:
    """The checker itself: a two-layer loop is found, a one-way stack is not."""
    assert find_cycle({"engine": {"spec"}, "spec": {"engine"}}) == ["engine", "spec", "engine"]
    assert find_cycle({"engine": {"spec", "model"}, "spec": {"model"}, "model": set()}) is None


def test_sub_packages_stack_one_way() -> None:
    """No import cycle between reference_impl's layers; the root modules import no sub-package."""
    graph = package_graph()
    assert find_cycle(graph) is None, f"import cycle between sub-packages: {' -> '.join(find_cycle(graph))}"
    assert graph["root"] == set(), f"config/request/faults/registry import sub-packages: {graph['root']}"


def test_only_cross_cutting_modules_at_the_package_root() -> None:
    top = sorted(p.stem for p in (ROOT / PACKAGE).glob("*.py") if p.stem != "__init__")
    assert set(top) <= ROOT_MODULES, f"modules outside a sub-package: {sorted(set(top) - ROOT_MODULES)}"


def test_reference_impl_never_imports_the_harness() -> None:
    """The import direction is harness/ → reference_impl/, never back."""
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for path in source_files()
        for target, _, line in imports(path)
        if target.split(".")[0] in ABOVE
    ]
    assert not bad, bad


def test_no_private_names_across_packages() -> None:
    """A module takes only public names (no leading underscore) from another layer."""
    known = {module_name(p) for p in source_files()}
    bad = [
        f"{path.relative_to(ROOT)}:{line} takes {name} from {target}"
        for path in source_files()
        for target, names, line in imports(path)
        if target in known and unit(target) != unit(module_name(path))
        for name in names
        if name.startswith("_") and name != "__future__"
    ]
    assert not bad, bad


@pytest.mark.parametrize("factor", sorted(registry.COMPONENTS))
def test_registry_levels_resolve(factor: str) -> None:
    """Every built-in level's import path names an attribute that exists (None only for pd = off: no transport)."""
    for level in registry.COMPONENTS[factor]:
        resolved = registry.resolve(factor, level)
        assert (resolved is None) == ((factor, level) == ("pd", "off")), (factor, level, resolved)


#: harness's layers, top down: an import goes to the same layer or a lower one, never up, never across. The
#: matrix reads its engine's declaration (its levels) and the oracles' names; an oracle reads what an engine
#: applied (``Traits``) and writes a verdict (``results.rows``); a reproducer re-runs cells (``repro`` over ``run``);
#: the models the engines serve are made below them all (``models``).
HARNESS_LAYERS = {"entry": 6, "repro": 5, "run": 4, "matrix": 3, "oracles": 2, "sut": 1, "results": 1, "models": 0}
#: the entry points: ``python -m harness``, the pytest plugin and the command line (the only importers of reports/).
HARNESS_ENTRY = {"harness.__main__", "harness.pytest_plugin"}


def harness_unit(module: str) -> str:
    """``harness.run.cell`` → ``run``; the entry points (``__main__``, the plugin, ``cli/``) → ``entry``."""
    if module in HARNESS_ENTRY or module == "harness" or module.split(".")[1] == "cli":
        return "entry"
    return module.split(".")[1]


def module_graph(package: str) -> dict[str, set[str]]:
    """Module → the modules of the same package it imports."""
    known = {module_name(p) for p in source_files(package)}
    # a module's own ancestor packages run before it whatever it imports: ``from pkg import sibling`` is no cycle
    return {module_name(path): {t for t, _, _ in imports(path)
                                if t in known and t != module_name(path) and not module_name(path).startswith(t + ".")}
            for path in source_files(package)}


def test_harness_modules_import_no_cycle() -> None:
    """No module of harness/ imports (directly or through others) one that imports it back."""
    graph = module_graph("harness")
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_harness_layers_stack_one_way() -> None:
    """entry points → run → matrix → oracles → sut / results: no import goes up a layer or across to a sibling."""
    bad = [
        f"{module} ({harness_unit(module)}) imports {target} ({harness_unit(target)})"
        for module, targets in module_graph("harness").items()
        for target in sorted(targets)
        if harness_unit(target) != harness_unit(module)
        and HARNESS_LAYERS[harness_unit(target)] >= HARNESS_LAYERS[harness_unit(module)]
    ]
    assert not bad, bad
    top = sorted(p.stem for p in (ROOT / "harness").glob("*.py") if p.stem != "__init__")
    assert top == ["__main__", "pytest_plugin"], f"modules outside a sub-package: {top}"


def test_only_the_entry_points_import_reports() -> None:
    """The record never depends on how it is shown: below the entry points, nothing in harness/ imports reports/."""
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for path in source_files("harness")
        if harness_unit(module_name(path)) != "entry"
        for target, _, line in imports(path)
        if target.split(".")[0] == "reports"
    ]
    assert not bad, bad


def test_reports_read_the_record_through_harness_results_only() -> None:
    """reports/ renders: of the project's own packages it imports only harness.results (and itself)."""
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for path in source_files("reports")
        for target, _, line in imports(path)
        if target.split(".")[0] in {"harness", "reference_impl", "fixtures"}
        and not (target == "harness.results" or target.startswith("harness.results."))
    ]
    assert not bad, bad


def test_the_layer_check_sees_an_upward_import() -> None:
    """The checker itself: a results module importing the runner is an upward import."""
    assert HARNESS_LAYERS[harness_unit("harness.run.cell")] > HARNESS_LAYERS[harness_unit("harness.results.store")]
    assert harness_unit("harness.cli.main") == harness_unit("harness.pytest_plugin") == "entry"


def test_fault_names_are_spelled_once() -> None:
    """A fault's name is written in reference_impl/faults.py only; every other module imports the ``Fault``."""
    from reference_impl.faults import FAULTS

    bad = [
        f"{path.relative_to(ROOT)}:{node.lineno} spells {node.value!r}"
        for path in source_files()
        if path.name != "faults.py" or path.parent.name != PACKAGE
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Constant) and node.value in FAULTS
    ]
    assert not bad, bad


def test_the_plugin_alone_imports_neither_torch_nor_the_engine() -> None:
    """pytest loads the plugin in every run of the environment: on an unrelated project it must stay light."""
    code = ("import sys, harness.pytest_plugin; "
            "print(sorted(m for m in ('torch', 'reference_impl', 'harness.run.cell') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout


#: no harness module grows past this many lines (STYLE.md: a file over ~400 lines needs a reason you can name).
MAX_MODULE_LINES = 400


def test_no_harness_module_is_over_400_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in source_files("harness") if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, long


def reached_engines(graph: dict[str, set[str]], package: str, engines: list[str]) -> list[str]:
    """The other engine packages that ``package``'s modules import, directly or through modules outside it (a shared
    module that imports an engine package is no way round): each as the import path that reaches it."""
    paths = {m: [m] for m in graph if m == package or m.startswith(package + ".")}
    queue, found = list(paths), []
    while queue:
        module = queue.pop(0)
        for target in sorted(graph.get(module, ())):
            if target in paths:
                continue
            owner = next((e for e in engines if target == e or target.startswith(e + ".")), None)
            paths[target] = [*paths[module], target]
            if owner is not None and owner != package:
                found.append(" -> ".join(paths[target]))
            elif owner is None:
                queue.append(target)
    return found


def test_engine_packages_import_no_other_engine_package() -> None:
    """Each engine is one package: what two share (vLLM's rules for its offline and server paths,
    ``harness.sut.vllm_common``) lives below both, and the cross_engine reference is found by what an engine computes,
    not imported (``harness.sut.cross_golden``)."""
    from harness import sut

    engines, graph = sorted(sut.BUILTIN.values()), module_graph("harness")
    bad = [path for package in engines for path in reached_engines(graph, package, engines)]
    assert not bad, bad


def test_the_engine_import_check_sees_a_reach_through_a_shared_module() -> None:
    graph = {"e.a": {"e.a.x"}, "e.a.x": {"shared"}, "shared": {"e.b.y"}, "e.b": set(), "e.b.y": set()}
    assert reached_engines(graph, "e.a", ["e.a", "e.b"]) == ["e.a.x -> shared -> e.b.y"]
    assert reached_engines(graph, "e.b", ["e.a", "e.b"]) == []


#: an engine's packages: the only places that may name an engine (its registry line in harness/sut/__init__.py aside).
ENGINE_PACKAGES = ("harness/sut/reference/", "harness/sut/vllm/", "harness/sut/openai/")
_NAMED_ENGINE = re.compile(r"""(==|!=|\bin)\s*\(?\s*["'](reference|vllm|openai)["']|["'](reference|vllm|openai)["']\s*(==|!=)|"""
                           r"""\bengine\w*\s*(==|!=)\s*["']""")


def test_no_code_outside_an_engine_package_tests_the_engine_by_name() -> None:
    """A fourth engine is one package and one registry line: nothing else may branch on an engine's name."""
    paths = [*source_files("harness"), *source_files("reports"), *sorted((ROOT / "benchmarks").glob("*.py"))]
    bad = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
           for path in paths if not str(path.relative_to(ROOT)).startswith(ENGINE_PACKAGES)
           for number, line in enumerate(path.read_text().splitlines(), start=1) if _NAMED_ENGINE.search(line)]
    assert not bad, bad


def test_the_engine_name_check_sees_a_branch() -> None:
    assert _NAMED_ENGINE.search('if spec.engine == "openai":') and _NAMED_ENGINE.search('if engine != "reference"')
    assert _NAMED_ENGINE.search("kind in ('vllm', 'openai')") and not _NAMED_ENGINE.search('name="vllm",')


#: the most fields any record handed to an oracle may have: an oracle reads a narrow view, not a hub.
MAX_VIEW_FIELDS = 12


def test_what_an_oracle_reads_is_narrow() -> None:
    """The view and every record it hands on (the engine's traits, a pass's result) have at most 12 fields."""
    from harness.oracles.view import PassView
    from harness.sut.base import CacheTraits, PassResult, SpecTraits, Traits

    wide = {cls.__name__: len(fields(cls)) for cls in (PassView, Traits, SpecTraits, CacheTraits, PassResult)
            if len(fields(cls)) > MAX_VIEW_FIELDS}
    assert not wide, wide


#: a comparison that may test a name: ``==``, ``!=``, and ``in`` / ``not in`` a literal tuple, list or set.
_EQUALITY, _MEMBERSHIP = (ast.Eq, ast.NotEq), (ast.In, ast.NotIn)


def compared_strings(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(string, line) for every string literal a comparison tests a value against (``x == "a"``, ``"a" != x``,
    ``x in ("a", "b")``) and every ``case "a":`` of a ``match``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.MatchValue) and isinstance(node.value, ast.Constant):
            yield node.value.value, node.lineno
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, sides, sides[1:]):
            if isinstance(op, _EQUALITY):
                yield from ((side.value, node.lineno) for side in (left, right) if isinstance(side, ast.Constant))
            elif isinstance(op, _MEMBERSHIP) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                yield from ((item.value, node.lineno) for item in right.elts if isinstance(item, ast.Constant))


def registered_names() -> dict[str, str]:
    """Every built-in oracle's and engine's name → the module (or package) that declares it, the one place that may
    compare a value with it."""
    from harness import oracles, sut

    return {**{oracle.name: oracle.judge.__module__ for oracle in oracles.BUILTIN}, **sut.BUILTIN}


def names_compared_outside_their_module(path: Path, source: str, owners: dict[str, str]) -> list[str]:
    """The comparisons in ``path`` (its text ``source``) with an oracle's or an engine's name, where ``path`` is not
    that oracle's or engine's own module."""
    module = module_name(path)
    return [f"{path.relative_to(ROOT)}:{line} compares with {value!r} (declared in {owners[value]})"
            for value, line in compared_strings(ast.parse(source, filename=str(path)))
            if isinstance(value, str) and value in owners
            and module != owners[value] and not module.startswith(owners[value] + ".")]


def test_no_code_branches_on_an_oracle_or_engine_name_outside_its_own_module() -> None:
    """An oracle's view and reproducer needs are in its declaration, an engine's behaviour in its package: nothing in
    harness/ or reports/ compares a value with a built-in oracle's name outside ``harness/oracles/<name>.py``, or with
    an engine's outside ``harness/sut/<engine>/`` (an API name such as llama.cpp's ``[server] api`` is no engine's)."""
    owners = registered_names()
    bad = [finding for path in [*source_files("harness"), *source_files("reports")]
           for finding in names_compared_outside_their_module(path, path.read_text(), owners)]
    assert not bad, bad


def test_the_name_check_sees_a_branch_and_spares_the_owner() -> None:
    owners = registered_names()
    branches = ('if check.oracle == "tokens": pass', 'ok = "cached_tokens" != name', 'x = o in ["nan", "other"]',
                'if engine in {"vllm"}: pass', 'match oracle:\n    case "pd_audit": pass')
    here = ROOT / "reports" / "evidence.py"
    assert all(names_compared_outside_their_module(here, code, owners) for code in branches)
    plain = ('tolerances.get("logprobs")', 'for kind in ("logprobs", "tie"): pass', 'x = "tokens" in row["oracles"]',
             'if api != "llamacpp": pass')
    assert not any(names_compared_outside_their_module(here, code, owners) for code in plain)
    assert not names_compared_outside_their_module(ROOT / "harness" / "oracles" / "tokens.py", branches[0], owners)
    assert not names_compared_outside_their_module(ROOT / "harness" / "sut" / "vllm" / "engine.py", branches[3], owners)


#: the packages each of whose modules is tested in the test module of its name: ``harness/a/b.py`` in
#: ``tests/harness/a/test_b.py`` (and so for reference_impl/ and fixtures/), where a reader looks for it first.
MIRRORED = ("harness", "reference_impl", "fixtures")
_TRITON = ("tested through TritonBackend against dense attention in "
           "tests/reference_impl/attention/test_triton_backend.py (interpreted on CPU, compiled for sm_90)")
_INTERFACE = ("an interface (a Protocol): tests/reference_impl/test_registry.py checks that every built-in level "
              "offers it and that a user class lacking a member is refused")
_CHILD_TRANSPORT = ("a child-process PD transport, tested in tests/reference_impl/pd/test_disagg.py (the same bytes as "
                    "pd = inproc; a killed decode child ends the cell as an error)")
_PD_SIDE = ("a PD side, tested through DisaggEngine in tests/reference_impl/pd/test_disagg.py (invisible to the "
            "client, exactly the pages past the decode hit, lost chunks) and tests/harness/oracles/test_pd_audit.py")
_SPEC = ("tested through the engine in tests/reference_impl/spec/test_verify.py (tokens bitwise the plain ones, "
         "accept length, the draft state on hits, MTP's tail layer)")
_SOLVE = "tested through covering.solve in tests/harness/matrix/covering/test_solve.py, checked by brute force"
#: the modules without a test module of their own name, each with where its tests are instead. A module that gains
#: its test module, or is gone, leaves this list in the same change: the test below names any such entry.
UNMIRRORED: dict[str, str] = {
    # -- the reproducer scripts: one test module per engine's writer and standalone code together
    "harness/sut/script/text.py": "the parts every script shares, tested through the scripts they assemble: "
                                  "tests/harness/sut/script/test_checks.py (a script's exit status) and "
                                  "tests/harness/sut/vllm/test_script.py (the definitions copied in)",
    "harness/sut/script/install.py": "a REPORT's install lines, tested in tests/findings/test_render.py (a report "
                                     "opens with the install lines, then the command)",
    "harness/models/recipes.py": "the checkpoints' inline recipes, tested in tests/harness/sut/vllm/test_script.py "
                                 "and tests/harness/sut/openai/test_llamacpp_script.py (they rebuild the served "
                                 "tensors)",
    "harness/sut/reference/script.py": "the reference's script, tested through `harness repro` on planted faults in "
                                       "tests/harness/repro/test_reproduce.py (the script exits 1 with the fault)",
    "harness/sut/reference/standalone.py": "the reference's standalone serve, tested through `harness repro` in "
                                           "tests/harness/repro/test_reproduce.py and in "
                                           "tests/harness/sut/script/test_checks.py (it imports reference_impl alone)",
    "harness/sut/vllm/standalone.py": "vLLM's standalone serve, tested with its writer in "
                                      "tests/harness/sut/vllm/test_script.py and run on vLLM by "
                                      "tests/findings/test_findings.py",
    "harness/sut/openai/llamacpp_standalone.py": "llama.cpp's standalone serve, tested with its writer in "
                                                 "tests/harness/sut/openai/test_llamacpp_script.py (a stand-in server)",
    # -- the systems under test: the protocol and the shared machinery, tested through the engines that use them
    "harness/sut/base.py": "the protocol and Engine, tested through every engine's tests and the toy engine of "
                           "tests/e2e/test_plugins.py",
    "harness/sut/levels.py": "an engine's levels, tested through each engine's refusals and checks: "
                             "tests/harness/sut/vllm/test_engine.py, tests/harness/sut/openai/test_table.py, "
                             "tests/e2e/test_plugins.py",
    "harness/sut/interrupt.py": "Ctrl-C and a killed harness, tested end to end in tests/e2e/test_lifecycle.py",
    "harness/sut/watched.py": "the engine wrapper that watches inputs, tested in tests/harness/sut/test_inputs.py",
    "harness/sut/rules.py": "the shared paged rule, tested through the rules that wrap it in "
                            "tests/harness/sut/vllm_common/test_cache.py and the cached_tokens oracle's tests",
    "harness/sut/openai/launch.py": "a server's launch, tested in tests/harness/sut/openai/test_table.py and "
                                    "test_engine.py, and by the real servers in tests/e2e/test_real_servers.py",
    "harness/sut/openai/server.py": "a running server, tested against stand-in servers in "
                                    "tests/harness/sut/openai/test_engine.py",
    "harness/sut/openai/wire.py": "the wire formats, tested against recorded responses in "
                                  "tests/harness/sut/openai/test_engine.py and test_llamacpp.py",
    "harness/sut/openai/sglang.py": "SGLang's server rules, tested in tests/harness/sut/openai/test_sglang_server.py",
    "harness/sut/openai/vllm.py": "vLLM's server rules, tested in tests/harness/sut/openai/test_vllm_server.py",
    "harness/sut/reference/engine.py": "the reference engine, tested through every reference matrix "
                                       "(tests/e2e/test_oracles_fire.py) and the cache model's agreement with it",
    "harness/sut/reference/trained.py": "SmolLM2 read into the reference, tested in tests/e2e/test_smollm2.py (its "
                                        "cross_engine reference)",
    "harness/sut/vllm/arguments.py": "levels to vllm.LLM arguments, tested in tests/harness/sut/vllm/test_engine.py "
                                     "and test_connectors.py",
    "harness/sut/vllm/poison.py": "runs in vLLM's child: tested with planted faults on the real engine in "
                                  "tests/harness/sut/vllm/test_inside.py",
    "harness/sut/vllm/protocol.py": "the child's line protocol, tested in tests/harness/sut/vllm/test_child.py and "
                                    "test_engine.py (a stand-in child)",
    "harness/sut/vllm_common/applied.py": ("what vLLM applied, tested in tests/harness/sut/vllm_common/test_cache.py "
                                           "(judged by the block drop it applied) and "
                                           "tests/harness/sut/vllm/test_engine.py (a setting vLLM overrode)"),
    "harness/sut/vllm_common/spec.py": ("vLLM's proposers' rules, tested in tests/fixtures/test_spec_expect.py (the "
                                        "n-gram rule against vLLM's own search) and "
                                        "tests/harness/sut/vllm/test_engine.py"),
    "harness/sut/vllm_common/metrics.py": ("the connector metrics, tested in "
                                           "tests/harness/sut/openai/test_vllm_server.py (read from a server's "
                                           "exposition) and, in the child, every vLLM cell's pd_audit"),
    "harness/sut/vllm_common/interpreter.py": "one path and one variable, used by every vLLM test that needs "
                                              "vLLM's environment (tests/harness/sut/vllm/test_child.py)",
    # -- the entry points and commands, tested end to end through the command line
    "harness/__main__.py": "`python -m harness`, tested through `python -m harness list` in "
                           "tests/harness/results/test_store.py (a closed pipe ends quietly) and "
                           "tests/harness/matrix/covering/test_fixedsize.py (the same cells on every run)",
    "harness/cli/matrix_tests.py": "the matrix's pytest items, tested through the plugin end to end in "
                                   "tests/harness/test_pytest_plugin.py (one item per cell, -k, --lf, evidence)",
    "harness/cli/repro.py": "`harness repro`, tested end to end in tests/harness/repro/test_reproduce.py",
    "harness/cli/findings.py": "`harness findings`, tested in tests/findings/test_render.py (every finding renders; "
                               "every engine-bug list is what the findings render today)",
    "harness/repro/lists.py": "the engine-bug lists, tested in tests/findings/test_render.py (the lists in README and "
                              "docs are the findings' own; a changed finding makes its list stale)",
    "harness/repro/report.py": "a finding folder rendered, tested in tests/findings/test_render.py (every finding's "
                               "REPORT.md renders from its data and notes; a script without its packages exits 2) and "
                               "tests/harness/repro/test_reproduce.py",
    "harness/repro/expect.py": "a script's check, tested through `harness repro` in "
                               "tests/harness/repro/test_reproduce.py (the script it writes exits 1 with the fault)",
    # -- the matrix file and its covering arrays
    "harness/matrix/errors.py": "the one-line MatrixError, tested through every bad input in "
                                "tests/harness/matrix/test_file.py (it names the file, the key and the value)",
    "harness/matrix/tables.py": "a matrix file's tables, tested through loading in tests/harness/matrix/test_file.py "
                                "(constraints, [cost], [[stronger]], [[workloads]]) and "
                                "tests/harness/matrix/test_cells.py ([[cells]])",
    "harness/matrix/selection.py": "`--cell` and `--shard`, tested through `harness run` in "
                                   "tests/harness/results/test_store.py and tests/harness/cli/test_main.py, and "
                                   "select_cells in tests/harness/matrix/test_cells.py",
    "harness/matrix/covering/exact.py": f"greedy, the LP bound and the ILP, {_SOLVE}",
    "harness/matrix/covering/ipog.py": f"IPOG, {_SOLVE}, and its rows as the search's start in "
                                       "tests/harness/matrix/covering/test_fixedsize.py",
    "harness/matrix/covering/postopt.py": f"the row reduction and cost passes every method ends with, {_SOLVE}",
    "harness/matrix/covering/space.py": f"the tuple numbering the methods share, {_SOLVE}",
    # -- the models the engines serve
    "harness/models/checkpoints.py": "the served checkpoints, tested through what reads them back: "
                                     "tests/harness/models/test_gguf_export.py, tests/harness/models/test_trained.py "
                                     "and vLLM's child in tests/harness/sut/vllm/test_child.py",
    "harness/models/gguf_weights.py": "tested through the GGUF export in tests/harness/models/test_gguf_export.py "
                                      "(tensors read back with gguf's reader, q/k rows permuted)",
    "harness/models/weights.py": "the seeded weights a reproducer carries, tested in "
                                 "tests/harness/sut/script/test_checks.py and tests/harness/sut/vllm/test_script.py (a "
                                 "script rebuilds the harness's)",
    # -- oracles whose tests need an engine
    "harness/oracles/inputs.py": "tested through engines that change their inputs in place: "
                                 "tests/harness/sut/test_inputs.py, tests/harness/sut/vllm/test_inputs.py, "
                                 "tests/harness/sut/openai/test_engine.py",
    "harness/oracles/pressure.py": "tested through a tight vLLM cell whose stand-in child never preempts, in "
                                   "tests/harness/sut/vllm/test_engine.py",
    # -- the record, tested through the commands that write and read it
    "harness/results/compare.py": "`harness compare`, tested in tests/harness/cli/test_triage.py (new, fixed, still "
                                  "failing, drift) and tests/harness/results/test_hosts.py (the facts two hosts "
                                  "differ in)",
    "harness/results/files.py": "the report directory's file names, tested through the runs that write them: "
                                "tests/harness/cli/test_main.py (the three files), tests/harness/results/test_store.py",
    "harness/results/frame.py": "a run's rows as a DataFrame, tested through its readers: compare in "
                                "tests/harness/cli/test_triage.py, the grid in tests/reports/test_page.py",
    "harness/results/header.py": "the run header, tested through `harness run` in tests/harness/cli/test_main.py (it "
                                 "records the host and the engines' build; a changed run's resume is refused)",
    "harness/results/locate.py": "tested through `harness locate` in tests/harness/run/test_locate.py and the report's "
                                 "located combinations in tests/reports/test_page.py",
    "harness/results/reader.py": "tested through the reports that read a run (tests/reports/test_page.py, "
                                 "tests/reports/test_browser.py), tests/harness/results/test_hosts.py, and malformed "
                                 "rows named in tests/harness/results/test_store.py",
    "harness/results/rows.py": "a cell's row, tested in tests/harness/results/test_store.py (strict JSON: NaN and "
                               "infinities) and tests/harness/cli/test_triage.py (a wrong-shaped row is named)",
    # -- the stages of a cell, tested through the cells they run
    "harness/run/cell.py": "the stages in order, tested through run_plan in tests/harness/run/test_boundary.py, "
                           "run_cell in tests/reference_impl/pd/test_disagg.py and "
                           "tests/reference_impl/spec/test_verify.py, and "
                           "`harness run` in tests/harness/cli/test_main.py (a crash is an error, a slow cell times "
                           "out)",
    "harness/run/faultcheck.py": "tested in tests/reference_impl/test_faults.py (every fault fails exactly its trigger "
                                 "cells) and through `harness kill` in tests/harness/cli/test_main.py",
    "harness/run/golden.py": "the golden runs, tested through GoldenRuns in tests/reference_impl/test_faults.py, "
                             "tests/harness/run/test_boundary.py and tests/reference_impl/pd/test_disagg.py",
    "harness/run/judge.py": "the judge stage, tested through every cell judged: tests/harness/matrix/test_declared.py "
                            "(declared failures and tolerances), tests/reference_impl/test_faults.py (each fault "
                            "through the oracle it names)",
    "harness/run/plan.py": "the plan stage, tested through plan_cell in tests/harness/run/test_boundary.py, "
                           "tests/harness/run/test_parallel.py, tests/harness/matrix/test_declared.py and "
                           "tests/harness/matrix/test_boundary.py",
    "harness/run/row.py": "the row stage, tested through the rows runs write: tests/harness/cli/test_main.py, "
                          "tests/reference_impl/spec/test_verify.py (accept length and draft-state metrics)",
    "harness/run/serve.py": "the serve stage, tested through run_workload in "
                            "tests/fixtures/workloads/test_cache_model.py, "
                            "tests/reference_impl/cache/test_host_cache.py and "
                            "tests/reference_impl/cache/test_storage_cache.py",
    "harness/run/session.py": "one matrix run opened, tested through `harness run` in tests/harness/cli/test_main.py "
                              "(a resume on another CPU is refused) and check_runnable in "
                              "tests/harness/matrix/test_declared.py",
    "harness/run/trial.py": "one configuration on explicit workloads, tested through `harness repro` in "
                            "tests/harness/repro/test_reproduce.py and the boundary stage in "
                            "tests/harness/run/test_boundary.py",
    # -- data
    "fixtures/spec_bands.py": "a data table (accept-length bands measured by benchmarks/bench_spec.py --bands), "
                              "read through spec_expect.accept_band, held in tests/fixtures/test_trained_bands.py",
    "fixtures/workloads/basic.py": "the first workloads, data every engine test serves; their expectations are checked "
                                   "in tests/fixtures/workloads/test_expect.py and "
                                   "tests/fixtures/workloads/test_cache_model.py",
    "reference_impl/config.py": "configuration dataclasses every engine test builds; Mamba2Config's own checks in "
                                "tests/reference_impl/model/test_mamba2.py",
    "reference_impl/request.py": "request records, built by every engine and oracle test "
                                 "(tests/reference_impl/engine/test_llm_engine.py, "
                                 "tests/harness/oracles/test_oracles.py)",
    "reference_impl/model/forward_batch.py": "what one model step reads, a record the attention tests build: "
                                             "tests/reference_impl/attention/test_torch_backend.py, "
                                             "tests/reference_impl/attention/test_triton_backend.py",
    # -- the reference engine's interfaces and the parts tested through the engine
    "reference_impl/attention/backend.py": _INTERFACE,
    "reference_impl/cache/prefix_cache.py": _INTERFACE,
    "reference_impl/cache/store/base.py": _INTERFACE,
    "reference_impl/engine/queue.py": _INTERFACE,
    "reference_impl/memory/pool.py": _INTERFACE,
    "reference_impl/pd/base.py": _INTERFACE,
    "reference_impl/spec/proposer.py": _INTERFACE,
    "reference_impl/attention/triton_ops/common.py": f"the loop every kernel shares, {_TRITON}",
    "reference_impl/attention/triton_ops/decode.py": f"the decode kernels, {_TRITON}",
    "reference_impl/attention/triton_ops/extend.py": f"the extend kernels, {_TRITON}",
    "reference_impl/attention/triton_ops/interpreter.py": f"the interpreter's tile-independent tl.dot, {_TRITON}",
    "reference_impl/engine/scheduler.py": "the queue policies, tested through the engine in "
                                          "tests/reference_impl/engine/test_llm_engine.py (priorities, preemption) "
                                          "and the priority_scheduler_drop fault in "
                                          "tests/reference_impl/test_faults.py",
    "reference_impl/memory/layout.py": "a pool's byte blocks, tested through PD transfers in "
                                       "tests/reference_impl/pd/test_disagg.py (the bytes sent; an envelope never cut)",
    "reference_impl/memory/static.py": "the static pools, tested against the unified pool in "
                                       "tests/reference_impl/memory/test_unified.py, in "
                                       "tests/reference_impl/memory/test_poison.py, and by every engine test",
    "reference_impl/model/batch_invariant.py": "deterministic mode's building blocks, tested through the "
                                               "batch_invariance oracle on the deterministic = on cells of the fault "
                                               "matrices in tests/reference_impl/test_faults.py",
    "reference_impl/pd/decode.py": _PD_SIDE,
    "reference_impl/pd/prefill.py": _PD_SIDE,
    "reference_impl/pd/inproc/conn.py": f"pd = inproc, {_PD_SIDE}",
    "reference_impl/pd/ledger.py": "PD's bookkeeping, tested through pd_audit in "
                                   "tests/harness/oracles/test_pd_audit.py (each check fails when its count is off)",
    "reference_impl/pd/mooncake/conn.py": _CHILD_TRANSPORT,
    "reference_impl/pd/nixl/agent.py": _CHILD_TRANSPORT,
    "reference_impl/pd/nixl/conn.py": _CHILD_TRANSPORT,
    "reference_impl/pd/remote.py": _CHILD_TRANSPORT,
    "reference_impl/pd/wire.py": "what crosses from prefill to decode, tested through "
                                 "tests/reference_impl/pd/test_disagg.py (the bytes sent are the pages past the hit)",
    "reference_impl/spec/draft.py": _SPEC,
    "reference_impl/spec/draft_model.py": _SPEC,
    "reference_impl/spec/mtp.py": _SPEC,
}
_TEST_FILE = re.compile(r"tests/[\w/]+\.py")


def mirror_of(module: str) -> str:
    """``harness/a/b.py`` → ``tests/harness/a/test_b.py``."""
    path = PurePosixPath(module)
    return str(PurePosixPath("tests", path.parent, f"test_{path.name}"))


def mirror_problems(root: Path, exceptions: Mapping[str, str], packages: Iterable[str] = MIRRORED) -> list[str]:
    """Every module of ``packages`` under ``root`` (its ``__init__`` aside) without its mirrored test module and not
    in ``exceptions``, and every entry of ``exceptions`` that is stale: its module has its test module, or is gone."""
    modules = {path.relative_to(root).as_posix() for package in packages for path in (root / package).rglob("*.py")
               if path.name != "__init__.py"}
    bare = {module for module in modules if not (root / mirror_of(module)).exists()}
    return sorted([*(f"{m}: no {mirror_of(m)}; write it, or list the module in UNMIRRORED with where its tests are"
                     for m in bare - exceptions.keys()),
                   *(f"{m}: listed in UNMIRRORED, yet {mirror_of(m)} exists: drop the entry"
                     for m in exceptions.keys() & (modules - bare)),
                   *(f"{m}: listed in UNMIRRORED, yet there is no such module: drop the entry"
                     for m in exceptions.keys() - modules)])


def test_every_module_has_its_mirrored_test_module_or_a_reason() -> None:
    """A module's tests are where a reader looks first, or UNMIRRORED says where they are; the list holds no stale
    entry."""
    problems = mirror_problems(ROOT, UNMIRRORED)
    assert not problems, "\n".join(problems)


def test_every_test_file_a_reason_names_exists() -> None:
    """A test file renamed or split leaves no reason pointing at the old name."""
    gone = sorted(f"{module}: {path}" for module, reason in UNMIRRORED.items()
                  for path in _TEST_FILE.findall(reason) if not (ROOT / path).is_file())
    assert not gone, gone


def test_the_mirror_check_sees_a_missing_test_module_and_a_stale_exception(tmp_path: Path) -> None:
    """The checker itself, on a tree of its own: a module without a test module, an exception whose module has one
    now, an exception for a module that is gone; a listed or mirrored module passes."""
    for path in ("harness/__init__.py", "harness/a/__init__.py", "harness/a/bare.py", "harness/a/tested.py",
                 "tests/harness/a/test_tested.py", "fixtures/data.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    problems = mirror_problems(tmp_path, {"harness/a/tested.py": "r", "harness/a/gone.py": "r"}, ("harness",))
    assert [problem.split(":")[0] for problem in problems] == ["harness/a/bare.py", "harness/a/gone.py",
                                                               "harness/a/tested.py"], problems
    assert "no tests/harness/a/test_bare.py" in problems[0] and "no such module" in problems[1]
    assert "tests/harness/a/test_tested.py exists" in problems[2]
    assert mirror_problems(tmp_path, {"harness/a/bare.py": "r"}, ("harness",)) == []
    assert [p.split(":")[0] for p in mirror_problems(tmp_path, {}, ("harness", "fixtures"))] == [
        "fixtures/data.py", "harness/a/bare.py"]
