"""Where checkpoints live: the small protocol every backend implements, and what works over any
of them (a download in pieces, a whole folder fetched). ``backends.py`` picks a backend for a URL.

    storage = open_storage("s3://bucket/run1")          # backends.py: FsspecStorage (s3fs)
    storage.put([(Path("staging/trainer.pt"), "step-00000010/trainer.pt")])
    storage.commit("step-00000010/manifest.json", text)  # the object that publishes the rest
    storage.list("step-00000010")       # {"trainer.pt": Entry(size=...), "manifest.json": ...}
    storage.get("step-00000010/trainer.pt", start=0, end=1024)   # a byte range
    storage.delete(["step-00000010"], recursive=True)

A backend holds objects by key (``/``-separated paths below its root) and gives five operations
and a check: ``list``, ``get`` (a byte range of one object), ``put`` (local files or bytes, each
object whole or not at all), ``commit`` (one small object, written only once everything put
before is durable: seeing it means seeing them), ``delete`` and ``probe`` (can this process
write, list and delete here). Every failure is a :class:`~paratrain.errors.StorageError` whose
text names the URL, the operation and the fix. That is all
:class:`~paratrain.checkpoint.remote_store.RemoteStore` needs: it stages each save on the local
disk with the local store's crash-safe code, then puts the files and commits the manifest.

A new backend is one module: a class with these methods, registered for its URL scheme with
:func:`~paratrain.checkpoint.backends.register_storage` (see docs/project/architecture.md, "Where
things go"). The backends
here: :class:`~paratrain.checkpoint.local_storage.LocalStorage` (``file://``),
:class:`~paratrain.checkpoint.memory_storage.MemoryStorage` (``memory://``) and
:class:`~paratrain.checkpoint.object_storage.FsspecStorage` (every other fsspec URL).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from paratrain.errors import CheckpointError, ConfigError

PIECE_BYTES = 64 << 20
"""Bytes per ``get`` when a backend without a download of its own copies an object to a file."""


@dataclass(frozen=True)
class Entry:
    """One object: its size, and what changes when it is rewritten (ETag, time)."""

    size: int
    modified: float
    tag: str


Source = Path | bytes
"""What ``put`` writes: a local file's contents, or bytes."""


@runtime_checkable
class Storage(Protocol):
    """The operations a checkpoint backend gives (see the module docstring)."""

    url: str
    """Where the objects are, as the user wrote it (no trailing ``/``); used in messages."""

    def probe(self) -> None:
        """ConfigError unless this process can write, list and delete objects here."""

    def list(self, under: str = "") -> dict[str, Entry]:
        """Every object below ``under`` (all by default), by key relative to it; ``""`` when
        ``under`` names one object."""

    def get(self, key: str, *, start: int = 0, end: int | None = None) -> bytes | None:
        """Bytes ``[start, end)`` of the object ``key`` (to its end when ``end`` is None);
        None when there is no such object."""

    def put(self, items: Sequence[tuple[Source, str]]) -> None:
        """Write each (source, key); a reader sees an object whole or not at all. The order in
        which they become visible is not given: :meth:`commit` orders."""

    def commit(self, key: str, data: bytes) -> None:
        """Write the object ``key`` after everything put before it is durable: whoever sees it
        sees them. A checkpoint's ``manifest.json`` is committed this way."""

    def delete(self, keys: Iterable[str], *, recursive: bool = False) -> None:
        """Delete objects (``recursive``: everything below each key too); missing is fine."""


def url_of(storage: Storage, key: str) -> str:
    """The URL of ``key`` in ``storage`` (for messages)."""
    return f"{storage.url}/{key}" if key else storage.url


def read_objects(storage: Storage, keys: Sequence[str]) -> dict[str, bytes | None]:
    """The whole contents of each of ``keys`` (None where missing), read concurrently."""
    batched = getattr(storage, "read_many", None)
    if callable(batched):  # a backend with a concurrent read of its own
        return batched(list(keys))  # type: ignore[no-any-return]
    if len(keys) <= 1:
        return {key: storage.get(key) for key in keys}
    with ThreadPoolExecutor(min(8, len(keys))) as pool:
        return dict(zip(keys, pool.map(storage.get, keys), strict=True))


def download(storage: Storage, pairs: Sequence[tuple[str, Path]]) -> None:
    """Copy each object ``key`` to its local ``path``, concurrently, in pieces of
    :data:`PIECE_BYTES` (a large shard never sits whole in memory)."""
    for _, local in pairs:
        local.parent.mkdir(parents=True, exist_ok=True)
    batched = getattr(storage, "download_many", None)
    if callable(batched):  # e.g. fsspec's concurrent get
        batched(list(pairs))
        return

    def copy(pair: tuple[str, Path]) -> None:
        key, local = pair
        with local.open("wb") as out:
            start = 0
            while True:
                piece = storage.get(key, start=start, end=start + PIECE_BYTES)
                if piece is None:
                    raise FileNotFoundError(f"{url_of(storage, key)} does not exist")
                out.write(piece)
                start += len(piece)
                if len(piece) < PIECE_BYTES:
                    return

    if len(pairs) <= 1:
        for pair in pairs:
            copy(pair)
        return
    with ThreadPoolExecutor(min(8, len(pairs))) as pool:
        list(pool.map(copy, pairs))


def fetch_all(storage: Storage, local: Path) -> None:
    """Copy every object of ``storage`` (or the single object at its URL) to ``local``;
    CheckpointError when nothing is there."""
    objects = storage.list()
    if not objects:
        raise CheckpointError(f"{storage.url} does not exist (no object there). Check the URL.")
    if list(objects) == [""]:  # the URL names one object
        download(storage, [("", local)])
        return
    download(storage, [(key, local / key) for key in objects if key])


def read_source(source: Source) -> bytes:
    """The bytes a ``put`` writes for ``source``."""
    return source if isinstance(source, bytes) else Path(source).read_bytes()


def no_options(scheme: str, options: Mapping[str, Any]) -> None:
    """ConfigError for storage options given to a backend that takes none."""
    if options:
        raise ConfigError(
            f"a {scheme}:// location takes no storage options (got {sorted(options)}); remove "
            "ckpt_storage_options"
        )
