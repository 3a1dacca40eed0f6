"""kvmatrix harness: entry points (cli/, the pytest plugin) over run/ (runner, oracles), sut/ (systems under
test), results/ (the run record) and matrix/ (matrix model and files)."""
