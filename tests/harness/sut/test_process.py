"""A process's log read as it grows: each read returns what it wrote since the last, its writes through its own
descriptor."""
from __future__ import annotations

import subprocess
import tempfile

from harness.sut.process import LogCursor


def test_a_log_cursor_reads_what_the_process_wrote_since_the_last_read() -> None:
    with tempfile.TemporaryFile(mode="w+") as log:
        cursor = LogCursor(log.fileno())
        assert cursor.new() == ""
        subprocess.run(["/bin/sh", "-c", "printf 'started\\nNIXL transfer failure: x\\n'"], stdout=log, check=True)
        assert cursor.new() == "started\nNIXL transfer failure: x\n"
        subprocess.run(["/bin/sh", "-c", "printf 'served\\n'"], stdout=log, check=True)
        assert cursor.new() == "served\n"
        assert cursor.new() == ""
