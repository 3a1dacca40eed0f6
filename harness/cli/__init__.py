"""Entry points: `python -m harness` (main: list, run, kill), the listings of what the code registers (tables), the
report/compare/locate commands (triage), the pytest items of a matrix (matrix_tests) and the run progress line."""
