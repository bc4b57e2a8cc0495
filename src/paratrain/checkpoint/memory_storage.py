"""Checkpoint storage in this process's memory (``memory://run1``): for tests, notebooks and
trying the object-storage path without a bucket.

    storage = MemoryStorage.open("memory://run1", {})
    storage.put([(b"...", "step-00000010/trainer.pt")])
    MemoryStorage.open("memory://run1", {}).list()    # the same objects: one store per URL

Objects live as long as the process, shared by every ``MemoryStorage`` opened at the same URL in
it (not across processes: a multi-rank job needs a store every rank reaches). A put replaces an
object at once, so a reader sees it whole or not at all; a commit is a put made after the others.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from paratrain.checkpoint.storage import Entry, Source, no_options, read_source

_STORES: dict[str, dict[str, tuple[bytes, Entry]]] = {}
_LOCK = threading.Lock()


class MemoryStorage:
    """Objects in a dict shared per URL (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.root = self.url.split("://", 1)[-1].strip("/")
        with _LOCK:
            self._objects = _STORES.setdefault(self.root, {})

    @classmethod
    def open(cls, url: str, options: Mapping[str, Any]) -> MemoryStorage:
        """``memory://<name>`` (no storage options)."""
        no_options("memory", options)
        return cls(url)

    def __repr__(self) -> str:
        return f"MemoryStorage({self.url!r})"

    def probe(self) -> None:
        """Always writable."""

    def list(self, under: str = "") -> dict[str, Entry]:
        """Every object below ``under``."""
        with _LOCK:
            items = list(self._objects.items())
        if under in self._objects:
            return {"": self._objects[under][1]}
        prefix = f"{under.rstrip('/')}/" if under else ""
        return {k[len(prefix) :]: e for k, (_, e) in items if k.startswith(prefix)}

    def get(self, key: str, *, start: int = 0, end: int | None = None) -> bytes | None:
        """Bytes ``[start, end)`` of ``key``; None when missing."""
        with _LOCK:
            found = self._objects.get(key)
        return None if found is None else found[0][start:end]

    def put(self, items: Sequence[tuple[Source, str]]) -> None:
        """Store each object (replacing one there)."""
        for source, key in items:
            data = read_source(source)
            entry = Entry(size=len(data), modified=time.time(), tag=str(time.time_ns()))
            with _LOCK:
                self._objects[key] = (data, entry)

    def commit(self, key: str, data: bytes) -> None:
        """Store ``key`` (memory needs no flush first)."""
        self.put([(data, key)])

    def delete(self, keys: Iterable[str], *, recursive: bool = False) -> None:
        """Remove objects (``recursive``: everything below each key too)."""
        with _LOCK:
            for key in keys:
                self._objects.pop(key, None)
                if recursive:
                    prefix = f"{key.rstrip('/')}/"
                    for k in [k for k in self._objects if k.startswith(prefix)]:
                        del self._objects[k]

    @staticmethod
    def forget(url: str) -> None:
        """Drop every object of the store at ``url`` (tests)."""
        with _LOCK:
            _STORES.pop(url.split("://", 1)[-1].strip("/").rstrip("/"), None)
