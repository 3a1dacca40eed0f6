"""Code a reproducer script carries verbatim: it imports nothing of kvmatrix (``checks`` the standard library alone,
each engine's module that engine alone), so the script runs where only the engine is installed. The script writers
(``harness.repro.scripts``) copy these modules' definitions into each script; the tests import them as they are."""
