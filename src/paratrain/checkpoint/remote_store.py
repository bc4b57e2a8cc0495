"""Checkpoints on object storage (``ckpt_dir="s3://bucket/run1"``, any URL with a
:class:`~paratrain.checkpoint.storage.Storage` backend): the local store's crash-safe save into a
staging folder, then an upload whose last object, committed, is the manifest.

    store = open_store("s3://bucket/run1", staging=Path("runs/exp/.ckpt-staging"), ...)
    store.check_writable()        # collective: ConfigError on every rank unless rank 0 can write
    store.save(request)           # written and committed in staging, then uploaded
    found = store.latest_valid()  # newest checkpoint whose objects download and verify

A save runs exactly as on a local disk, in ``staging/<host>/`` (one folder per machine). Then
every rank uploads the DCP shards it wrote, and rank 0, once all have, uploads ``trainer.pt``
and the weights, then ``manifest.xxh3``, then ``manifest.json``: an object store has no rename,
so the manifest is the commit point. A folder without ``manifest.json`` was never committed: it
is invisible to resume and removed by the next save (like a local ``.tmp-*`` folder). Rotation
(``keep_last``) deletes a checkpoint's ``manifest.json`` first, so it leaves the readers' view at
once, and the rest in a background thread. The staging folder keeps the newest uploaded
checkpoint (and any fetched one) as a verified cache; older copies go at the next save.

A resume lists the ``step-*`` folders, reads their manifests (checked against ``manifest.xxh3``),
and takes the newest: one process per machine downloads it into staging (or finds an identical
cached copy), checks every file against the manifest's checksums, and every rank then loads it
through the local code. A damaged or incomplete checkpoint is skipped with a warning; an
unreachable store is a :class:`~paratrain.errors.StorageError`, which stops the resume instead
of starting fresh.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import torch.distributed as dist

from paratrain.checkpoint.backends import open_storage
from paratrain.checkpoint.formats import describe
from paratrain.checkpoint.manifest import (
    MANIFEST,
    MANIFEST_CHECKSUM,
    Manifest,
    manifest_checksum,
)
from paratrain.checkpoint.object_storage import is_url
from paratrain.checkpoint.restore import Staged
from paratrain.checkpoint.storage import (
    Entry,
    Storage,
    download,
    read_objects,
    url_of,
)
from paratrain.checkpoint.store import PREFIX, CheckpointStore, distributed
from paratrain.errors import (
    CheckpointDamagedError,
    CheckpointError,
    ConfigError,
    ParatrainError,
    StorageError,
)


def open_store(
    location: str | Path,
    *,
    staging: Path,
    storage_options: Mapping[str, Any] | None,
    keep_last: int | None,
    check_timeout_s: float,
    warn: Callable[[str], None],
    say: Callable[[str], None],
) -> CheckpointStore:
    """The store for ``location``: a folder, or a URL (then ``staging`` holds local copies)."""
    if is_url(location):
        return RemoteStore(
            open_storage(str(location), storage_options),
            staging=staging,
            keep_last=keep_last,
            check_timeout_s=check_timeout_s,
            warn=warn,
            say=say,
        )
    return CheckpointStore(
        Path(location), keep_last=keep_last, check_timeout_s=check_timeout_s, warn=warn
    )


class RemoteStore(CheckpointStore):
    """Saves to and loads from one folder on object storage (see the module docstring)."""

    def __init__(
        self,
        storage: Storage,
        *,
        staging: Path,
        keep_last: int | None,
        check_timeout_s: float,
        warn: Callable[[str], None],
        say: Callable[[str], None],
    ) -> None:
        super().__init__(
            staging / _node(), keep_last=keep_last, check_timeout_s=check_timeout_s, warn=warn
        )
        self.storage = storage
        self.say = say
        self._leader: bool | None = None
        self._newest: str | None = None
        """The staging copy of the newest upload (kept as a verified cache)."""
        self._fetched: set[str] = set()
        """Staging copies this process downloaded (a model registered later loads from one)."""
        self._staging_lock = threading.Lock()
        """Held while the staging folder changes: an async save's upload tidies it, while the
        main thread may be downloading into it (``run.latest_checkpoint()``)."""
        self._manifests: dict[str, tuple[Entry, Manifest | str]] = {}
        """Parsed manifests (an error text if unreadable) by folder name, with the listing entry
        of the manifest.json they were read from."""

    def __repr__(self) -> str:
        return (
            f"RemoteStore({self.storage.url!r}, keep_last={self.keep_last}, "
            f"staging={str(self.directory)!r})"
        )

    @property
    def location(self) -> str:
        """The URL of the checkpoints."""
        return self.storage.url

    def check_writable(self) -> None:
        """Collective: ConfigError on every rank unless rank 0 can write, list and delete at
        the URL (bucket, credentials and endpoint are checked before any training)."""
        problem = None
        if _rank() == 0:
            try:
                self.storage.probe()
            except ConfigError as err:
                problem = f"ckpt_dir {self.storage.url!r} cannot be used: {err}"
        problem = _from_rank0(problem)
        if problem:
            raise ConfigError(problem)

    def move_aside(self, name: str) -> Path:
        """Object storage has no rename of a folder: refused with what to do instead."""
        raise ConfigError(
            f"previous_run='fresh' cannot move the checkpoints at {self.location} aside on "
            "object storage. Give this run another ckpt_dir, or delete them with your storage's "
            "tools."
        )

    def read_mark(self, name: str) -> dict[str, Any]:
        """No records beside checkpoints on object storage (a preempted run there is resumed
        with ``paratrain run --resume`` / ``run.resume()``, not by a mark)."""
        return {}

    def write_mark(self, name: str, mark: dict[str, Any]) -> None:
        """Nothing is written (see :meth:`read_mark`)."""

    def remove_mark(self, name: str) -> None:
        """Nothing to remove (see :meth:`read_mark`)."""

    # -- saving ---------------------------------------------------------------------------
    def _agree_on_folder(self, step: int) -> tuple[Path, Path]:
        leader = self._leads_node()
        chosen: tuple[str, str] | str = ""
        if _rank() == 0:
            try:
                chosen = self._new_folder(step)
            except StorageError as err:  # raised on every rank alike, below
                chosen = str(err)
            except OSError as err:
                chosen = _staging_problem(self.directory, err)
        chosen = _from_rank0(chosen)
        if isinstance(chosen, str):
            raise StorageError(f"{chosen} Nothing was saved.")
        if leader and _rank() != 0:  # another machine: its own staging folder
            self._tidy()
        return self.directory / chosen[0], self.directory / chosen[1]

    def _new_folder(self, step: int) -> tuple[str, str]:
        """Rank 0: (name, temporary name) of a new save; leftovers of interrupted saves go."""
        folders = _by_folder(self.storage.list())
        self._tidy()
        leftovers = [n for n, files in folders.items() if MANIFEST not in files]
        self.storage.delete(leftovers, recursive=True)  # interrupted uploads or deletions
        name, k = f"{PREFIX}{step:08d}", 1
        while name in folders or (self.directory / name).exists():
            name, k = f"{PREFIX}{step:08d}.{k}", k + 1  # newer wins, as on a local disk
        tmp = self.directory / f".tmp-{name}-{os.getpid()}-{time.time_ns()}"
        tmp.mkdir(parents=True)
        return name, tmp.name

    def _publish_shards(self, tmp: Path, final: Path, written: Mapping[str, Any]) -> str | None:
        pairs = [(tmp / "dcp" / rel, f"{final.name}/dcp/{rel}") for rel in written]
        try:
            self.storage.put(pairs)
        except StorageError as err:
            return f"{err} The checkpoint was not committed; earlier ones are intact."
        return None

    def _committed(self, final: Path, manifest: Manifest, published: set[str]) -> None:
        rest = [name for name in manifest.files if name not in published]
        try:
            self.storage.put([(final / name, f"{final.name}/{name}") for name in rest])
            # The checksum file first: whoever sees manifest.json (the commit point) sees both.
            self.storage.put([(final / MANIFEST_CHECKSUM, f"{final.name}/{MANIFEST_CHECKSUM}")])
            self.storage.commit(f"{final.name}/{MANIFEST}", (final / MANIFEST).read_bytes())
        except StorageError as err:
            raise StorageError(
                f"{err} The checkpoint was not committed; earlier ones are intact."
            ) from None
        self._newest = final.name
        self._tidy()
        try:
            self._rotate_remote(manifest.lineage, keep=final.name)
        except StorageError as err:  # the save itself is committed
            self.warn(f"old checkpoints were not rotated: {err} The next save tries again.")

    def _rotate_remote(self, lineage: str, *, keep: str) -> None:
        """Delete this lineage's checkpoints beyond ``keep_last``: each one's manifest.json now
        (it leaves every reader's view at once), the rest in a background thread."""
        if self.keep_last is None:
            return
        own = [p.name for p, m in self._listed() if m is not None and m.lineage == lineage]
        doomed = [name for name in own[max(self.keep_last, 1) :] if name != keep]
        if not doomed:
            return
        self.storage.delete([f"{name}/{MANIFEST}" for name in doomed])
        self._deleting = threading.Thread(
            target=self._remove_quietly, args=(doomed,), name="paratrain-rotate", daemon=False
        )
        self._deleting.start()

    def _remove_quietly(self, names: list[str]) -> None:
        try:
            self.storage.delete(names, recursive=True)
        except StorageError as err:
            self.warn(f"{err} The next save removes what is left.")

    def _tidy(self) -> None:
        """Remove staging copies no longer needed (interrupted saves and fetches, older saves)."""
        with self._staging_lock:
            if not self.directory.is_dir():
                return
            keep = {*self._fetched, *([self._newest] if self._newest else [])}
            for entry in self.directory.iterdir():
                if entry.name not in keep and entry.name.startswith((".tmp-", PREFIX)):
                    shutil.rmtree(entry, ignore_errors=True)

    def wait(self) -> None:
        """Block until an in-flight save is uploaded and rotated checkpoints are deleted."""
        try:
            super().wait()
        finally:
            if self._deleting is not None:  # started by the save that wait() just joined
                self._deleting.join()
                self._deleting = None

    # -- finding and loading ------------------------------------------------------------------
    def _listed(self) -> list[tuple[Path, Manifest | None]]:
        """Committed checkpoints (a ``manifest.json`` present) with their manifests (None:
        unreadable), newest save first; each path is the folder's place in staging."""
        folders = _by_folder(self.storage.list())
        committed = {n: files[MANIFEST] for n, files in folders.items() if MANIFEST in files}
        self._read_manifests(committed)
        found = []
        for name, entry in committed.items():
            if name not in self._manifests:  # deleted while it was listed
                continue
            parsed = self._manifests[name][1]
            manifest = parsed if isinstance(parsed, Manifest) else None
            found.append((manifest.created if manifest else entry.modified, name, manifest))
        found.sort(key=lambda item: (item[0], item[1]), reverse=True)
        return [(self.directory / name, manifest) for _, name, manifest in found]

    def _read_manifests(self, committed: dict[str, Entry]) -> None:
        """Read and parse the manifests not read before (or rewritten since)."""
        stale = [n for n, entry in committed.items() if self._manifests.get(n, (None,))[0] != entry]
        keys = [f"{n}/{f}" for n in stale for f in (MANIFEST, MANIFEST_CHECKSUM)]
        got = read_objects(self.storage, keys)
        for name in stale:
            text = got[f"{name}/{MANIFEST}"]
            if text is None:
                self._manifests.pop(name, None)
                continue
            try:
                parsed: Manifest | str = Manifest.parse(
                    text,
                    got[f"{name}/{MANIFEST_CHECKSUM}"],
                    where=url_of(self.storage, f"{name}/{MANIFEST}"),
                    folder=url_of(self.storage, name),
                )
            except CheckpointError as err:
                parsed = str(err)
            self._manifests[name] = (committed[name], parsed)

    def candidates(self) -> list[tuple[Path, Manifest]]:
        """Committed checkpoints whose manifest reads, newest first; warns about the others."""
        found = []
        for folder, manifest in self._listed():
            if manifest is None:
                self.warn(f"skipping {url_of(self.storage, folder.name)}: {self._problem(folder)}")
            else:
                found.append((folder, manifest))
        return found

    def _problem(self, folder: Path) -> str:
        return str(self._manifests.get(folder.name, (None, "unreadable"))[1])

    def latest_valid(self) -> tuple[Path, Manifest] | None:
        """Newest checkpoint whose objects download and verify (into staging); warns about
        others. Not collective: only the caller's machine gets the copy."""
        for folder, manifest in self.candidates():
            try:
                return self._fetch(folder.name, manifest), manifest
            except CheckpointDamagedError as err:
                self.warn(f"skipping {url_of(self.storage, folder.name)}: {err}")
        return None

    def read(  # type: ignore[override]
        self, folder: Path, manifest: Manifest, adopt: Collection[str] = ()
    ) -> Staged:
        """Collective: one process per machine downloads (or finds cached) and verifies the
        checkpoint; every rank then reads it as from a local disk. Every rank raises the same
        CheckpointDamagedError (skip it) or StorageError (stop)."""
        problem: tuple[bool, str] | None = None
        if self._leads_node():
            try:
                self._fetch(folder.name, manifest)
            except CheckpointDamagedError as err:
                problem = (True, str(err))
            except ParatrainError as err:
                problem = (False, str(err))
            except OSError as err:
                problem = (False, _staging_problem(self.directory, err))
        for found in _gathered(problem):
            if found is not None:
                damaged, text = found
                raise (CheckpointDamagedError if damaged else StorageError)(text)
        return CheckpointStore.read(self.directory / folder.name, manifest, adopt)

    def _fetch(self, name: str, manifest: Manifest) -> Path:
        """The staging copy of checkpoint ``name``: cached if identical and intact, else
        downloaded and verified against ``manifest`` (CheckpointDamagedError if it fails)."""
        local = self.directory / name
        with self._staging_lock:
            if not _intact_copy(local, manifest):
                self._download(name, manifest, local)
            self._fetched.add(name)
        return local

    def _download(self, name: str, manifest: Manifest, local: Path) -> None:
        """Download into a temporary folder, verify every file, then rename it to ``local``."""
        where = url_of(self.storage, name)
        objects = self.storage.list(name)
        problems = [
            f"{rel} is missing"
            if rel not in objects
            else f"{rel} has {objects[rel].size} bytes, expected {record.bytes}"
            for rel, record in manifest.files.items()
            if rel not in objects or objects[rel].size != record.bytes
        ]
        if problems:  # found from the listing alone: nothing is downloaded
            raise CheckpointDamagedError(f"{where}: {'; '.join(problems)}")
        started = time.monotonic()
        tmp = self.directory / f".tmp-fetch-{name}-{os.getpid()}-{time.time_ns()}"
        try:
            download(self.storage, [(f"{name}/{rel}", tmp / rel) for rel in manifest.files])
            text = manifest.to_json().encode()
            (tmp / MANIFEST).write_bytes(text)
            (tmp / MANIFEST_CHECKSUM).write_bytes(manifest_checksum(text))
            problems = manifest.verify(tmp)
            if problems:
                raise CheckpointDamagedError(f"{where}: {'; '.join(problems)}")
            shutil.rmtree(local, ignore_errors=True)
            os.rename(tmp, local)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        size = sum(record.bytes for record in manifest.files.values())
        took = time.monotonic() - started
        self.say(f"paratrain: fetched {where} ({size / 1e6:.3g} MB in {took:.1f} s)")

    def _leads_node(self) -> bool:
        """Whether this rank is the first on its machine (collective the first time)."""
        if self._leader is None:
            hosts: list[Any] = [_node()]
            if distributed():
                hosts = [None] * dist.get_world_size()
                dist.all_gather_object(hosts, _node())
            self._leader = hosts.index(hosts[_rank()]) == _rank()
        return self._leader


def _staging_problem(directory: Path, err: OSError) -> str:
    return (
        f"The staging folder {directory} cannot be written ({describe(err)}). Free space there, "
        "or choose a run_dir on a disk with room for two checkpoints."
    )


def _intact_copy(local: Path, manifest: Manifest) -> bool:
    """True when ``local`` holds exactly the checkpoint of ``manifest``, every file intact."""
    if not (local / MANIFEST).is_file():
        return False
    try:
        return Manifest.read(local) == manifest and not manifest.verify(local)
    except CheckpointError:
        return False


def _by_folder(objects: dict[str, Entry]) -> dict[str, dict[str, Entry]]:
    """Objects of ``step-*`` folders, grouped by folder (other objects are not checkpoints)."""
    folders: dict[str, dict[str, Entry]] = {}
    for rel, entry in objects.items():
        top, _, rest = rel.partition("/")
        if rest and top.startswith(PREFIX):
            folders.setdefault(top, {})[rest] = entry
    return folders


def _node() -> str:
    """This machine's name, as a folder name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "node"


def _rank() -> int:
    return dist.get_rank() if distributed() else 0


def _from_rank0(value: Any) -> Any:
    if not distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gathered(value: Any) -> list[Any]:
    if not distributed():
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out
