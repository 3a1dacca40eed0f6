"""The findings as data: every finding renders its REPORT.md (and its script) from finding.json and notes.md, a
finding that does not render is named, the engine-bug lists in README.md and docs are the findings' own (a hand
edit fails), and every script, run where it cannot be judged (no engine packages, no engine binary), exits 2 with
its one line, never 1. Fast: no engine starts."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from harness.cli.findings import unrenderable
from harness.repro import lists
from harness.repro.report import FINDING, GENERATED, NOTES, REPORT, SCRIPT, load, render
from harness.sut.script.checks import CANNOT_JUDGE, CANNOT_JUDGE_LINE

ROOT = Path(__file__).resolve().parents[2]
FINDINGS = sorted(path.parent for path in ROOT.glob("findings/*/finding.json"))
SCRIPTED = [folder for folder in FINDINGS if load(folder)[0].get("script") is not None]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with nothing installed: an interpreter without torch, vllm or gguf."""
    where = tmp_path_factory.mktemp("bare")
    venv.create(where, with_pip=False)
    return where / "bin" / "python"


@pytest.mark.parametrize("folder", FINDINGS, ids=lambda path: path.name)
def test_every_finding_renders_its_report_from_its_data_and_notes(folder: Path) -> None:
    finding, notes = load(folder)
    text = render(folder)[REPORT]
    assert unrenderable(folder) is None
    assert text.startswith(f"# {notes.title}\n\n{GENERATED}\n"), folder.name
    assert finding["actual"] in text and finding["upstream"]["status"] in text, folder.name
    assert all(body in text for body in notes.sections.values()), f"{folder.name}: a section of {NOTES} not rendered"


def test_a_finding_that_does_not_render_is_named(tmp_path: Path) -> None:
    copy = shutil.copytree(SCRIPTED[0], tmp_path / SCRIPTED[0].name)
    data = json.loads((copy / FINDING).read_text())
    del data["upstream"]
    (copy / FINDING).write_text(json.dumps(data))
    why = unrenderable(copy)
    assert why is not None and why.startswith(f"{copy / FINDING}: does not render: KeyError")


def test_the_report_opens_with_the_install_lines_then_the_command_then_the_time() -> None:
    for folder in SCRIPTED:
        text = render(folder)[REPORT]
        install, command, took = text.index("```sh\npython3 -m venv venv"), text.index("-I repro.py\n```"), \
            text.index("Exit status: 1 while the bug shows")
        assert install < command < took < text.index("## "), folder.name


def test_a_report_without_a_script_opens_with_its_engines_install_lines_all_the_same() -> None:
    """Every REPORT.md starts with the environment it was seen in: where no script is rendered (an input the engine
    changes whatever the setting, a finding not seen again), the engine's own lines, and a word on why."""
    unscripted = [folder for folder in FINDINGS if folder not in SCRIPTED]
    assert unscripted
    for folder in unscripted:
        text = render(folder)[REPORT]
        install, why = text.index("```sh\npython3 -m venv venv"), text.index("No script is rendered for this finding")
        assert install < why < text.index("## "), folder.name
        assert "nixl" not in text[install:why], folder.name  # no setting's extras: the engine alone


def test_the_lists_in_readme_and_docs_are_the_findings_own() -> None:
    assert lists.stale(ROOT) == [], "run: python -m harness findings"


def test_a_changed_finding_makes_its_list_stale(tmp_path: Path) -> None:
    for target in lists.TARGETS:
        (tmp_path / target.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / target.path, tmp_path / target.path)
    shutil.copytree(ROOT / "findings", tmp_path / "findings")
    assert lists.stale(tmp_path) == []
    path = tmp_path / "findings" / "vllm-example-connector-chunked-prefill" / "finding.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "upstream": {**data["upstream"], "short": "fixed in 0.33.0"}}))
    assert lists.stale(tmp_path) == [target.path for target in lists.TARGETS]
    assert lists.stale(tmp_path, write=True) and lists.stale(tmp_path) == []
    assert "Upstream: fixed in 0.33.0." in (tmp_path / "README.md").read_text()


def test_a_list_without_its_markers_is_refused() -> None:
    with pytest.raises(lists.ListError, match="README.md"):
        lists.replace_block("no markers here\n", "- x", "README.md")


def judged_here(done: subprocess.CompletedProcess, reason: str) -> None:
    """Exit 2, never 1, with one line on stderr that says why (``reason`` in it)."""
    lines = [line for line in done.stderr.splitlines() if line.startswith(CANNOT_JUDGE_LINE)]
    assert done.returncode == CANNOT_JUDGE, done.stdout + done.stderr
    assert len(lines) == 1 and reason in lines[0], done.stderr


@pytest.mark.parametrize("folder", SCRIPTED, ids=lambda path: path.name)
def test_a_script_without_its_engine_packages_cannot_judge(folder: Path, tmp_path: Path, bare_python: Path) -> None:
    """Run by an interpreter without torch (a bare venv, ``-I``), a script exits 2 naming the missing packages and
    the install line, where ``import torch`` used to exit 1, "bug present" to ``git bisect run``."""
    (tmp_path / SCRIPT).write_text(render(folder)[SCRIPT])
    done = subprocess.run([str(bare_python), "-I", SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    judged_here(done, "torch")
    assert "install: python3 -m venv venv" in done.stderr


@pytest.mark.parametrize("folder", [f for f in SCRIPTED if load(f)[0]["engine"] == "llamacpp"], ids=lambda p: p.name)
def test_a_llamacpp_script_without_its_server_cannot_judge(folder: Path, tmp_path: Path) -> None:
    """With the packages but ``LLAMA_SERVER`` pointing nowhere: exit 2 naming it (or, on a CPU without the flag the
    finding needs, naming that first), before any server starts."""
    (tmp_path / SCRIPT).write_text(render(folder)[SCRIPT])
    done = subprocess.run([sys.executable, "-I", SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LLAMA_SERVER": str(tmp_path / "nowhere" / "llama-server")})
    judged_here(done, "this CPU lacks" if "this CPU lacks" in done.stderr else "no llama-server at LLAMA_SERVER=")
