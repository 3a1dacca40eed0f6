"""``python -m harness``: the kvmatrix command line.

A reader that stops early (``python -m harness list --matrix nightly | head``) closes the pipe:
that ends the command quietly with 141 (128 + SIGPIPE, what a shell reports for it), not a traceback.
A stop signal while the command line loads (torch takes seconds) ends it as one later does: 128 + the signal
and one line, since nothing has been started yet (harness.sut.interrupt takes over once it has loaded).
"""
import os
import signal
import sys

EXIT_BROKEN_PIPE = 141


def _loading_interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signum)


_held = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is not signal.SIG_IGN]
for _signum in _held:
    signal.signal(_signum, _loading_interrupted)
try:
    from harness.cli.main import main
except KeyboardInterrupt as exc:
    _signum = exc.args[0] if exc.args else signal.SIGINT
    print(f"interrupted by {signal.Signals(_signum).name} while loading", file=sys.stderr)
    sys.exit(128 + _signum)

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail too.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = EXIT_BROKEN_PIPE
sys.exit(code)
