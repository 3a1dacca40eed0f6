"""L3 storage backends behind a three-call interface: ``exists``, ``batch_get``, ``batch_set``.

Keys are ``tenant/pool/page-hash``: the chained page hash names a prefix, the pool name the
layout whose tensors the value holds, and the tenant namespace keeps one tenant's prefixes
from another's. Values are lists of tensors. A backend that fails raises ``StoreError``; the
storage cache (``cache.storage_cache``) turns that into a miss (it never trusts a partial answer).
A user's backend is any class with these three methods and this constructor
(``cache.store.base.Store``), named by import path in a matrix file.
"""
from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

#: where a matrix run's redis store lives unless a test names one (``.ci/run`` exports it).
REDIS_URL_ENV = "KVMATRIX_REDIS_URL"


class StoreError(RuntimeError):
    """A storage backend could not answer: unreachable, removed, or refused."""


def encode(tensors: Sequence[torch.Tensor]) -> bytes:
    """Serialize a list of CPU tensors (bitwise)."""
    buffer = io.BytesIO()
    torch.save([t.cpu() for t in tensors], buffer)
    return buffer.getvalue()


def decode(blob: bytes) -> list[torch.Tensor]:
    """The tensors ``encode`` wrote."""
    return torch.load(io.BytesIO(blob), weights_only=True)


class FileStore:
    """The embedded default: one file per key under a directory (a private temp dir unless given)."""

    def __init__(self, location: str | None = None) -> None:
        """Use ``location`` (shared between engines when the same), or a fresh temporary directory."""
        self._tmp = None if location else tempfile.TemporaryDirectory(prefix="kvmatrix-store-")
        self.root = Path(location or self._tmp.name)

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.pt"

    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored; StoreError when the directory is gone."""
        if not self.root.is_dir():
            raise StoreError(f"file store directory {self.root} does not exist")
        return [self._path(k).is_file() for k in keys]

    def batch_get(self, keys: Sequence[str]) -> list[list[torch.Tensor] | None]:
        """The value of each key (None where missing); StoreError when the directory is gone."""
        if not self.root.is_dir():
            raise StoreError(f"file store directory {self.root} does not exist")
        out = []
        for key in keys:
            try:
                out.append(decode(self._path(key).read_bytes()))
            except FileNotFoundError:
                out.append(None)
            except OSError as exc:
                raise StoreError(f"file store read of {key}: {exc}") from exc
        return out

    def batch_set(self, items: Mapping[str, Sequence[torch.Tensor]]) -> None:
        """Store every item (atomically per key: write a temp file, then rename)."""
        try:
            for key, tensors in items.items():
                path = self._path(key)
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(encode(tensors))
                os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(f"file store write under {self.root}: {exc}") from exc


class RedisStore:
    """Real Redis through redis-py; ``location`` is a redis:// URL (default: $KVMATRIX_REDIS_URL)."""

    def __init__(self, location: str | None = None) -> None:
        """Connect lazily to ``location``; StoreError when neither it nor the env var names a server."""
        import redis

        self.url = location or os.environ.get(REDIS_URL_ENV, "")
        if not self.url:
            raise StoreError(f"redis store has no URL: pass a location or set {REDIS_URL_ENV}")
        self._errors = (redis.exceptions.RedisError, OSError)
        self._client = redis.Redis.from_url(self.url, socket_timeout=2)

    def _run(self, what: str, fn: object) -> object:
        """Run ``fn(client)``; StoreError when Redis fails."""
        try:
            return fn(self._client)
        except self._errors as exc:
            raise StoreError(f"redis {what} at {self.url}: {exc}") from exc

    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored."""
        def run(client: object) -> list[bool]:
            pipe = client.pipeline()
            for key in keys:
                pipe.exists(key)
            return [bool(n) for n in pipe.execute()]
        return self._run("exists", run) if keys else []

    def batch_get(self, keys: Sequence[str]) -> list[list[torch.Tensor] | None]:
        """The value of each key (None where missing)."""
        blobs = self._run("mget", lambda client: client.mget(list(keys))) if keys else []
        return [decode(b) if b is not None else None for b in blobs]

    def batch_set(self, items: Mapping[str, Sequence[torch.Tensor]]) -> None:
        """Store every item in one MSET."""
        if items:
            payload = {k: encode(v) for k, v in items.items()}
            self._run("mset", lambda client: client.mset(payload))
