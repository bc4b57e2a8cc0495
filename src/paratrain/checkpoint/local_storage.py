"""A folder on this machine's file system as checkpoint storage (``file:///mnt/shared/run1``).

    storage = LocalStorage(Path("/mnt/shared/run1"))
    storage.put([(Path("staging/trainer.pt"), "step-00000010/trainer.pt")])
    storage.commit("step-00000010/manifest.json", text)

Every object is written to a temporary name beside it, flushed to the disk and renamed, so a
reader (or a crash) sees it whole or not at all; :meth:`LocalStorage.commit` also syncs the
folders of everything put since the last commit before writing, and its own folder after, so a
committed manifest never outlives the files it names. Temporary names start with ``.put-`` and
are not listed. A plain ``ckpt_dir`` folder does not come here: the local store writes there
directly (``checkpoint/store.py``); this backend is for URLs (``file://``), e.g. a mounted share
that should get the staged, upload-then-commit path of object storage.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from paratrain.checkpoint.durable_writes import fsync_dir
from paratrain.checkpoint.formats import describe
from paratrain.checkpoint.storage import Entry, Source, no_options
from paratrain.errors import ConfigError, StorageError

_TMP = ".put-"


class LocalStorage:
    """Objects as files below ``root`` (see the module docstring)."""

    def __init__(self, root: Path, url: str | None = None) -> None:
        self.root = Path(root)
        self.url = (url or str(self.root)).rstrip("/")
        self._unsynced: set[Path] = set()

    @classmethod
    def open(cls, url: str, options: Mapping[str, Any]) -> LocalStorage:
        """``file:///abs/path`` (no storage options)."""
        no_options("file", options)
        path = url.split("://", 1)[1]
        if not path.startswith("/"):
            raise ConfigError("a file:// URL needs an absolute path, e.g. file:///mnt/ckpt/run1")
        return cls(Path(path), url)

    def __repr__(self) -> str:
        return f"LocalStorage({self.url!r})"

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def _fail(self, doing: str, key: str, err: OSError) -> StorageError:
        where = f"{self.url}/{key}" if key else self.url
        return StorageError(
            f"{doing} {where} failed ({describe(err)}). Check that the folder exists, is "
            "writable by this user and has free space."
        )

    def probe(self) -> None:
        """ConfigError unless a small file can be written, listed and deleted here."""
        key = f"{_TMP}probe-{uuid.uuid4().hex[:12]}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._path(key).write_bytes(b"paratrain checks that it can write here\n")
            os.listdir(self.root)
            self._path(key).unlink()
        except OSError as err:
            doing = "writing, listing and deleting a file in"
            raise ConfigError(str(self._fail(doing, "", err))) from None

    def list(self, under: str = "") -> dict[str, Entry]:
        """Every file below ``under`` (temporary ones left out)."""
        base = self._path(under)
        try:
            if base.is_file():
                return {"": _entry(base)}
            out = {}
            for folder, dirs, files in os.walk(base):
                dirs[:] = [d for d in dirs if not d.startswith(_TMP)]
                for name in files:
                    if not name.startswith(_TMP):
                        path = Path(folder) / name
                        out[path.relative_to(base).as_posix()] = _entry(path)
            return out
        except OSError as err:
            raise self._fail("listing", under, err) from None

    def get(self, key: str, *, start: int = 0, end: int | None = None) -> bytes | None:
        """Bytes ``[start, end)`` of the file ``key``; None when it does not exist."""
        try:
            with self._path(key).open("rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(max(0, end - start))
        except FileNotFoundError:
            return None
        except OSError as err:
            raise self._fail("reading", key, err) from None

    def put(self, items: Sequence[tuple[Source, str]]) -> None:
        """Write each file under a temporary name, flush it, rename it into place."""
        for source, key in items:
            self._write(key, source)

    def _write(self, key: str, source: Source) -> None:
        final = self._path(key)
        tmp = final.with_name(f"{_TMP}{final.name}-{uuid.uuid4().hex[:8]}")
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(source, bytes):
                with tmp.open("wb") as out:
                    out.write(source)
                    out.flush()
                    os.fsync(out.fileno())
            else:
                with Path(source).open("rb") as src, tmp.open("wb") as out:
                    shutil.copyfileobj(src, out, 16 << 20)
                    out.flush()
                    os.fsync(out.fileno())
            os.replace(tmp, final)
            folder = final.parent  # it, and the folders made for it, up to the root
            while folder not in self._unsynced:
                self._unsynced.add(folder)
                if folder == self.root or self.root not in folder.parents:
                    break
                folder = folder.parent
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise self._fail("writing", key, err) from None

    def commit(self, key: str, data: bytes) -> None:
        """Sync the folders of what was put, then write ``key`` and sync its folder."""
        try:
            for folder in sorted(self._unsynced, key=lambda p: len(p.parts), reverse=True):
                fsync_dir(folder)
            self._unsynced.clear()
            self._write(key, data)
            fsync_dir(self._path(key).parent)
        except OSError as err:
            raise self._fail("committing", key, err) from None

    def delete(self, keys: Iterable[str], *, recursive: bool = False) -> None:
        """Remove files (``recursive``: folders too); missing is fine."""
        for key in keys:
            path = self._path(key)
            try:
                if recursive and path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
            except FileNotFoundError:
                continue
            except OSError as err:
                raise self._fail("deleting", key, err) from None


def _entry(path: Path) -> Entry:
    info = path.stat()
    return Entry(size=info.st_size, modified=info.st_mtime, tag=str(info.st_mtime_ns))
