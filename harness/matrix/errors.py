"""The one-line error a matrix file (or a request made of it) raises, naming the file and the key."""
from __future__ import annotations

from pathlib import Path


class MatrixError(ValueError):
    """A matrix file (or a request made of it) is invalid; the message is one line naming the input."""


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it is under it (shorter messages)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def matrix_error(path: Path, key: str, message: str) -> MatrixError:
    """A one-line ``MatrixError``: ``<file>: <key>: <message>`` (no key for whole-file problems)."""
    text = f"{shown_path(path)}: {key}: {message}" if key else f"{shown_path(path)}: {message}"
    return MatrixError(" ".join(text.splitlines()))
