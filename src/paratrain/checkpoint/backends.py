"""Which :class:`~paratrain.checkpoint.storage.Storage` a URL gets, by its scheme.

    storage = open_storage("s3://bucket/run1")          # FsspecStorage (s3fs)
    storage = open_storage("file:///mnt/shared/run1")   # LocalStorage
    storage = open_storage("memory://run1")             # MemoryStorage (one process)
    register_storage("vault", VaultStorage.open)        # before pt.Run(ckpt_dir="vault://...")
    with fetched("s3://bucket/run1/step-00000010") as local:   # a local copy, removed after
        read_state_dict(local)

``file://`` and ``memory://`` have backends of paratrain's own; every other scheme goes to fsspec
(:class:`~paratrain.checkpoint.object_storage.FsspecStorage`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from paratrain.checkpoint.local_storage import LocalStorage
from paratrain.checkpoint.memory_storage import MemoryStorage
from paratrain.checkpoint.object_storage import FsspecStorage, check_url
from paratrain.checkpoint.storage import Storage, fetch_all
from paratrain.core.paths import URL
from paratrain.errors import CheckpointError, ConfigError, ParatrainError

Opener = Callable[[str, Mapping[str, Any]], Storage]
"""``(url, options) -> Storage``; raises ConfigError for options it cannot use."""

_BACKENDS: dict[str, Opener] = {"file": LocalStorage.open, "memory": MemoryStorage.open}
"""URL scheme -> opener; every other scheme goes to fsspec."""


def register_storage(scheme: str, opener: Opener) -> None:
    """Use ``opener`` for URLs ``<scheme>://...`` (``ckpt_dir``, ``paratrain ckpt``)::

    register_storage("vault", VaultStorage.open)   # before pt.Run(ckpt_dir="vault://...")
    """
    _BACKENDS[scheme.lower()] = opener


def check_location(url: str, what: str, error: type[ParatrainError] = ConfigError) -> None:
    """Raise ``error`` now (no network) unless ``url`` can name checkpoint storage here: a
    scheme with a backend of its own (opening it checks the rest), or one fsspec opens."""
    if _scheme(url) not in _BACKENDS:
        check_url(url, what, error)


def open_storage(
    url: str,
    options: Mapping[str, Any] | None = None,
    *,
    what: str = "ckpt_dir",
    error: type[ParatrainError] = ConfigError,
) -> Storage:
    """The backend for ``url``; ``options`` (``ckpt_storage_options``) go to its opener."""
    opener = _BACKENDS.get(_scheme(url))
    if opener is None:
        return FsspecStorage.open(url, options, what=what, error=error)
    try:
        return opener(url, dict(options or {}))
    except ParatrainError as err:
        raise error(f"{what} {url!r}: {err}") from None


@contextlib.contextmanager
def fetched(url: str, options: Mapping[str, Any] | None = None) -> Iterator[Path]:
    """A local copy of the file or folder at ``url`` in a temporary folder, removed afterwards.
    A ParatrainError raised inside names ``url`` instead of the copy."""
    storage = open_storage(url, options, what="The checkpoint URL", error=CheckpointError)
    with tempfile.TemporaryDirectory(prefix="paratrain-fetch-") as tmp:
        name = PurePosixPath(storage.url.split("://", 1)[-1]).name
        local = Path(tmp) / (name or "checkpoint")
        fetch_all(storage, local)
        try:
            yield local
        except ParatrainError as err:
            raise type(err)(str(err).replace(str(local), storage.url)) from None


def _scheme(url: str) -> str:
    match = URL.match(os.fspath(url))
    return match.group(1).lower() if match else ""
