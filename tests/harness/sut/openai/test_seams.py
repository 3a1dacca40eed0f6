"""A server cell's seams (issue 42): page, step budget and context read from the launch its levels render, each
server's default where the launch leaves one out; nothing is built to read them."""
from __future__ import annotations

from dataclasses import replace

import pytest

from harness.matrix.model import BoundarySettings
from harness.matrix.file import load_matrix
from harness.matrix.model import generate
from harness.run.boundary import cell_seams
from harness.run.plan import plan_cell
from harness.sut.openai.seams import launch_argv, seams


def _seams(matrix: str, **levels: object):
    loaded = load_matrix(matrix)
    cell = next(c for c in generate(loaded) if all(c.as_dict().get(f) == v for f, v in levels.items()))
    return cell_seams(replace(plan_cell(loaded, cell, frozenset()), boundary=BoundarySettings()))


@pytest.mark.parametrize(("matrix", "levels", "page", "budget", "context"), [
    ("vllm_server", {"page_size": 64, "prefill_budget": 16}, 64, 16, 2048),
    ("vllm_server_smoke", {"cache": "device"}, 32, 2048, 2048),
    ("llamacpp_smoke", {"slots": 1}, 1, 2048, 8192),
    ("llamacpp_smoke", {"slots": 4}, 1, 2048, 2048),
    ("sglang", {"page_size": 1}, 1, 64, 2048),
])
def test_a_server_cells_seams_come_from_its_launch(matrix: str, levels: dict, page: int, budget: int,
                                                   context: int) -> None:
    found = _seams(matrix, **levels)
    assert (found.page, found.budget, found.context, found.vocab) == (page, budget, context, 256)


def test_flags_render_over_the_levels_and_artefacts_stay_placeholders() -> None:
    server = {"api": "llamacpp", "command": ["{llama_server}", "-m", "{gguf}", "-c", "4096", "-np", "{slots}"],
              "levels": {"batch": {"64": {"flags": ["-b", "{level}"]}}}}
    levels = {"model": "dense", "slots": 2, "batch": 64, "spec": "draft", "num_draft_tokens": 5}
    assert launch_argv(server, levels) == ["{llama_server}", "-m", "{gguf}", "-c", "4096", "-np", "2", "-b", "64"]
    found = seams(server, levels)
    assert (found.page, found.budget, found.context, found.k) == (1, 64, 2048, 5)
    found = seams({**server, "command": [*server["command"], "--kv-unified"]}, levels)
    assert found.context == 4096
