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
    """Nothing has started yet: one line, and out at once. Not an exception: raised inside an import in flight (a C
    extension's), it can come out as another error (numpy: "cannot load module more than once per process")."""
    os.write(sys.stderr.fileno(), f"interrupted by {signal.Signals(signum).name} while loading\n".encode())
    os._exit(128 + signum)


# SIGINT too, even where the process started ignoring it (as harness.sut.interrupt hears it later); any other
# signal the process started ignoring stays ignored (nohup).
_heard = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
          if s == signal.SIGINT or signal.getsignal(s) is not signal.SIG_IGN]
_previous = {signum: signal.signal(signum, _loading_interrupted) for signum in _heard}
from harness.cli.main import main  # noqa: E402  (torch takes seconds: a stop signal must be heard meanwhile)

for _signum, _handler in _previous.items():
    signal.signal(_signum, _handler)

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:
    # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail too.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = EXIT_BROKEN_PIPE
sys.exit(code)
