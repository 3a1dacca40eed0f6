"""The package layout: reference_impl's and harness's sub-packages each stack one way, reports/ only renders.

Read from the source with ``ast`` (every import statement, including those inside functions),
so a cycle or a reach into another package's private names fails here, not in a reader's head.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

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
