"""Programs from Debian's packages that some tests need: skip without them, except under CI=true (.ci/run installs them)."""
from __future__ import annotations

import os
import shutil

import pytest


def required_binary(name: str, what: str) -> str:
    """The path of program ``name``; skip without it, except under CI=true, where a missing one fails."""
    binary = shutil.which(name)
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed, and CI=true requires {what} to run")
        pytest.skip(f"{name} is not installed (apt-get install {name}); CI=true makes this a failure")
    return binary
