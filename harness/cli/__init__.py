"""Entry points: `python -m harness` (main), its report/compare/locate commands (triage) and the run progress line."""
