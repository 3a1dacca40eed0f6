"""kvmatrix harness: matrix generation, runner, oracles, results, pytest plugin, CLI."""
