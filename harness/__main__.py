"""``python -m harness``: the kvmatrix command line.

A reader that stops early (``python -m harness list --matrix nightly | head``) closes the pipe:
that ends the command quietly with 141 (128 + SIGPIPE, what a shell reports for it), not a traceback.
"""
import os
import sys

from harness.cli.main import main

EXIT_BROKEN_PIPE = 141

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail too.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = EXIT_BROKEN_PIPE
sys.exit(code)
