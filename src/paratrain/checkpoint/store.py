"""Checkpoint folders on disk: crash-safe commit, verification, rotation.

    store = CheckpointStore(Path("runs/exp/checkpoints"), keep_last=3)
    store.begin()                    # collective: every rank reached the save
    store.save(SaveRequest(states=..., trainer=..., manifest=..., sharded=False))
                                     # new temp folder -> fsync -> manifest -> rename
    found = store.latest_valid()     # newest save whose manifest and checksums verify
    staged = store.read(folder, manifest)          # every file verified once
    load_unit(staged, "model", target, [optimizer], trainer=staged.trainer())  # restore.py

Layout of ``step-00000120/``: per model, ``model.safetensors`` and ``optimizer.safetensors`` (the
model named ``model``; another model ``G`` has ``model.G.safetensors`` and
``optimizer.G.safetensors``), written by rank 0 for replicated strategies, or ``dcp/`` (FSDP,
every rank writes its shards); ``trainer.pt`` (plain data: loop state, schedulers, scaler, loader
positions, tracked objects, RNG of every rank, extras) and ``manifest.json``, written last with a
checksum per file. A save never writes into a folder that holds a committed checkpoint: a second
save at the same step goes to ``step-00000120.1`` and, being newer, wins. "Newest" is the time of
the save, not the step number, so a directory that also holds another run's checkpoints at higher
steps neither hides nor deletes this run's: rotation removes only checkpoints of the run's own
lineage.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import io
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_saver import async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.tensor import DTensor

from paratrain.checkpoint.dcp_io import RecordingWriter, zip_crc_skipped
from paratrain.checkpoint.durable_writes import fsync_dir, in_parallel, write_files_blocked
from paratrain.checkpoint.manifest import (
    MANIFEST,
    MANIFEST_CHECKSUM,
    FileRecord,
    Manifest,
    manifest_checksum,
)
from paratrain.checkpoint.restore import Staged, read_checkpoint, stems
from paratrain.checkpoint.safetensors_io import (
    safetensors_chunks,
    tied_names,
)
from paratrain.checkpoint.state import flatten_optimizer
from paratrain.checkpoint.verified_reads import (
    BLOCK_BYTES,
    checksum_file,
)
from paratrain.core import faults
from paratrain.errors import CheckpointError, lost_a_peer

PREFIX = "step-"


@dataclass(kw_only=True)
class SaveRequest:
    """What one save writes: plain state, already collected (the store gathers nothing)."""

    states: dict[str, tuple[dict[str, Any], dict[str, Any]]]
    """Model name -> (its state dict, its optimizers' state dict): whole tensors on rank 0 when
    not ``sharded``, else this rank's shards (DTensors), which every rank writes."""
    trainer: dict[str, Any]
    """Plain data: loop, loaders, schedulers, scaler, extras, per-rank objects, and every rank's
    random generator states under ``"rng"`` (rank ``r``'s at index ``r``)."""
    manifest: Manifest
    sharded: bool


@dataclass
class _Pending:
    thread: threading.Thread | None = None
    error: list[BaseException] = field(default_factory=list)


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class CheckpointStore:
    """Saves to and loads from one checkpoint directory."""

    def __init__(
        self,
        directory: Path,
        *,
        keep_last: int | None,
        check_timeout_s: float,
        warn: Callable[[str], None],
    ) -> None:
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.check_timeout_s = check_timeout_s
        self.warn = warn
        self._pending = _Pending()
        self._deleting: threading.Thread | None = None
        self._async_group: Any = None
        self._staging: dict[str, torch.Tensor] = {}
        self._copy_stream: Any = None
        self._spare: dict[tuple[tuple[int, ...], torch.dtype, bool], list[torch.Tensor]] = {}
        self._spare_lock = threading.Lock()
        self._preparing: threading.Thread | None = None
        self._spare_closed = False  # set by the first staging: spares left over are dropped

    def __repr__(self) -> str:
        return (
            f"CheckpointStore({str(self.directory)!r}, keep_last={self.keep_last}, "
            f"checkpoints={len(self.committed())})"
        )

    @property
    def location(self) -> str:
        """Where the checkpoints are, as the user named it (a folder, or a URL for
        :class:`~paratrain.checkpoint.remote_store.RemoteStore`)."""
        return str(self.directory)

    # -- saving ---------------------------------------------------------------------------
    # -- what a run asks of its checkpoint folder, whatever the storage -------------------------
    def check_writable(self) -> None:
        """Raise ConfigError (collective) when checkpoints cannot be written here. A local
        folder is created at the first save, and its path was checked with the settings."""

    def move_aside(self, name: str) -> Path:
        """Rename the whole folder to ``name`` beside it (``name-2``, ... when taken); the
        folder that checkpoints go to is then empty (``previous_run='fresh'``). Rank 0 only."""
        target = self.directory.with_name(name)
        n = 1
        while target.exists():
            n += 1
            target = self.directory.with_name(f"{name}-{n}")
        self.directory.rename(target)
        return target

    def read_mark(self, name: str) -> dict[str, Any]:
        """A small JSON record kept beside the checkpoints ({} when absent or unreadable)."""
        try:
            mark = json.loads((self.directory / name).read_text())
        except (OSError, ValueError, TypeError):
            return {}
        return mark if isinstance(mark, dict) else {}

    def write_mark(self, name: str, mark: dict[str, Any]) -> None:
        """Write ``mark`` as ``name`` atomically (a reader sees the old record or the new)."""
        path = self.directory / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(mark))
        os.replace(tmp, path)

    def remove_mark(self, name: str) -> None:
        """Remove the record ``name`` if it is there."""
        with contextlib.suppress(OSError):
            (self.directory / name).unlink()

    def begin(self) -> None:
        """Collective, before the caller collects what to save: wait for an earlier background
        save, and refuse a save that not every rank reached (CheckpointError)."""
        self.wait()
        self.check_every_rank_called()

    def save(self, request: SaveRequest, *, background: bool = False) -> Path | None:
        """Write and commit a checkpoint (collective, after :meth:`begin`). Returns its folder.

        ``background``: return once the state is copied to host memory; the files are written
        and committed in a thread (:meth:`wait` joins it)."""
        rank = dist.get_rank() if distributed() else 0
        final, tmp = self._agree_on_folder(request.manifest.step)
        states = request.states
        rng = request.trainer.pop("rng")
        if request.sharded:
            self._save_sharded(request, tmp, final, states, rng, background)
        elif rank == 0:
            if background:  # the host copy is the only stall; writing happens in a thread
                staged, ready = self._stage(states)

                def write() -> None:
                    ready()
                    self._write_replicated(request, tmp, final, staged, rng)

                self._start(write)
            else:
                self._write_replicated(request, tmp, final, states, rng)
        if not background and distributed():
            dist.barrier()
        return final

    def _stage(self, tree: Any) -> tuple[Any, Callable[[], object]]:
        """``tree`` with every tensor copied into a host buffer kept between saves, and a
        function that returns once the copies are complete.

        CPU tensors are copied at once. CUDA tensors go to pinned buffers on a copy stream of
        their own that starts after the work already queued; the training stream waits for the
        copy before its next kernels (a later in-place update cannot change what is saved),
        while this thread returns at once and the writer thread waits for the copy's event.
        """
        tensors: list[torch.Tensor] = []
        _collect_tensors(tree, tensors)
        cuda = [t for t in tensors if t.is_cuda]
        try:
            return self._stage_tensors(tree, cuda)
        finally:
            with self._spare_lock:  # every buffer is kept by path from now on
                self._spare_closed = True
                self._spare.clear()

    def _stage_tensors(
        self, tree: Any, cuda: list[torch.Tensor]
    ) -> tuple[Any, Callable[[], object]]:
        if not cuda:
            copies: list[tuple[torch.Tensor, torch.Tensor]] = []
            staged = self._copy_tree(tree, "", copies)
            copy_in_parallel(copies)
            return staged, lambda: None
        device = cuda[0].device
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        stream = self._copy_stream
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            staged = self._copy_tree(tree, "", None)
        done = stream.record_event()
        torch.cuda.current_stream(device).wait_stream(stream)
        return staged, done.synchronize

    def _copy_tree(
        self, tree: Any, path: str, copies: list[tuple[torch.Tensor, torch.Tensor]] | None
    ) -> Any:
        """``tree`` with its tensors replaced by kept buffers: copied now (CUDA, on the current
        stream) or, with ``copies``, listed there as (buffer, tensor) for the caller to copy."""
        if isinstance(tree, torch.Tensor):
            buffer = self._staging.get(path)
            if buffer is None or buffer.shape != tree.shape or buffer.dtype != tree.dtype:
                buffer = self._staging[path] = self._new_buffer(tree)
            if copies is None:
                return buffer.copy_(tree.detach(), non_blocking=tree.is_cuda)
            copies.append((buffer, tree.detach()))
            return buffer
        if isinstance(tree, dict):
            return {k: self._copy_tree(v, f"{path}/{k}", copies) for k, v in tree.items()}
        if type(tree) in (list, tuple):
            return type(tree)(self._copy_tree(v, f"{path}/{i}", copies) for i, v in enumerate(tree))
        return tree

    def prepare_staging(self, tensors: list[torch.Tensor]) -> None:
        """Allocate, in a background thread, the host buffers an asynchronous save of
        ``tensors`` will copy into (pinned for CUDA tensors; CPU ones written once, so that
        their pages exist), once per store. Allocating 1 GiB of pinned memory takes about half
        a second: without this, the first ``run.save()`` would stall for it. A save that
        starts before the thread is done allocates what is not ready yet itself. DTensor
        shards are skipped (sharded layouts save through DCP, which stages them itself)."""
        if self._preparing is not None or self._staging:
            return
        wanted = [
            (tuple(t.shape), t.dtype, t.is_cuda)
            for t in tensors
            if isinstance(t, torch.Tensor) and not isinstance(t, DTensor)
        ]

        def allocate() -> None:
            for shape, dtype, pinned in wanted:
                buffer = torch.empty(shape, dtype=dtype, pin_memory=pinned)
                if not pinned:  # pinned pages are resident already; these fault in now
                    buffer.zero_()
                with self._spare_lock:
                    if self._spare_closed:
                        return
                    self._spare.setdefault((shape, dtype, pinned), []).append(buffer)

        self._preparing = threading.Thread(target=allocate, name="paratrain-staging", daemon=True)
        self._preparing.start()

    def _new_buffer(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host buffer for ``tensor``: one :meth:`prepare_staging` made, or a new one."""
        key = (tuple(tensor.shape), tensor.dtype, tensor.is_cuda)
        with self._spare_lock:
            spare = self._spare.get(key)
            if spare:
                return spare.pop()
        return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)

    def check_every_rank_called(self) -> None:
        """Refuse a save (or a step before one) that not every rank reached (collective)."""
        if not distributed():
            return
        try:
            dist.monitored_barrier(
                timeout=datetime.timedelta(seconds=self.check_timeout_s), wait_all_ranks=True
            )
        except RuntimeError as err:
            if lost_a_peer(str(err)):
                raise CheckpointError(
                    f"run.save() stopped: another rank failed before it reached the save "
                    f"({err}). That rank's own error, printed by it, is the one to read and fix."
                ) from None
            raise CheckpointError(
                f"run.save() is collective: every rank must call it (only rank 0 writes). "
                f"Not every rank arrived within {self.check_timeout_s:.0f}s: {err}. Call "
                "run.save() on all ranks instead of under `if run.is_main:`."
            ) from None

    def _agree_on_folder(self, step: int) -> tuple[Path, Path]:
        """(final folder, temporary folder) of a new save, chosen by rank 0 for every rank."""
        names: list[str | None] = [None, None]
        if (dist.get_rank() if distributed() else 0) == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            for stale in self.directory.glob(".tmp-*"):
                if _abandoned(stale):  # an interrupted save's leftovers, not a live one's
                    shutil.rmtree(stale, ignore_errors=True)
            final = self.directory / f"{PREFIX}{step:08d}"
            k = 1
            while final.exists():  # a second save at this step: a new folder, newer wins
                final, k = self.directory / f"{PREFIX}{step:08d}.{k}", k + 1
            tmp = staging_folder(final)
            tmp.mkdir()
            names = [str(final), str(tmp)]
        if distributed():
            dist.broadcast_object_list(names, src=0)
        assert names[0] is not None and names[1] is not None
        return Path(names[0]), Path(names[1])

    def _write_replicated(
        self,
        request: SaveRequest,
        tmp: Path,
        final: Path,
        states: dict[str, tuple[dict[str, Any], dict[str, Any]]],
        rng: list[Any],
    ) -> None:
        files: dict[str, list[memoryview]] = {}
        metas: dict[str, Any] = {}
        for name, (model_sd, optim_sd) in states.items():
            model_stem, optim_stem = stems(name)
            tied = tied_names(model_sd)  # tied weights (written twice) named, to tie again
            files[f"{model_stem}.safetensors"] = safetensors_chunks(
                model_sd, {"tied": json.dumps(tied)} if tied else None
            )
            tensors, metas[name] = flatten_optimizer(optim_sd)
            files[f"{optim_stem}.safetensors"] = safetensors_chunks(tensors)
        trainer = {**request.trainer, "rng": rng, "optimizer_meta": metas}
        self._commit(request.manifest, tmp, final, trainer, files=files)

    def _save_sharded(
        self,
        request: SaveRequest,
        tmp: Path,
        final: Path,
        states: dict[str, tuple[dict[str, Any], dict[str, Any]]],
        rng: list[Any],
        background: bool,
    ) -> None:
        state: dict[str, Any] = {}
        for name, (model_sd, optim_sd) in states.items():
            model_stem, optim_stem = stems(name)
            state[model_stem], state[optim_stem] = model_sd, optim_sd
        writer = RecordingWriter(str(tmp / "dcp"), sync_files=True, overwrite=False)
        trainer = {**request.trainer, "rng": rng}

        def commit(group: Any = None) -> None:
            """Gather every rank's file records; rank 0 writes the manifest and commits."""
            mine = (writer.records, self._publish_shards(tmp, final, writer.records))
            gathered = [mine]
            if distributed():
                gathered = [({}, None) for _ in range(dist.get_world_size())]
                dist.all_gather_object(gathered, mine, group=group)
            failures = [failure for _, failure in gathered if failure]
            if failures:  # on every rank alike
                raise CheckpointError(failures[0])
            if (dist.get_rank() if distributed() else 0) == 0:
                merged = {f"dcp/{k}": v for r, _ in gathered for k, v in r.items()}
                records = _records_of(tmp, merged)
                self._commit(
                    request.manifest, tmp, final, trainer, records=records, published=set(merged)
                )

        if not background:
            with zip_crc_skipped():  # the writer checksums every block; see zip_crc_skipped
                dcp_save(state, storage_writer=writer)
            commit()
            return
        if distributed() and self._async_group is None:
            self._async_group = dist.new_group(backend="gloo")  # async collectives need their own
        future: Any = async_save(state, storage_writer=writer, process_group=self._async_group)

        def finish() -> None:
            future.result()  # every rank's shards and the metadata are on disk
            commit(self._async_group)

        self._start(finish)

    def _commit(
        self,
        manifest: Manifest,
        tmp: Path,
        final: Path,
        trainer: dict[str, Any],
        *,
        files: dict[str, list[memoryview]] | None = None,
        records: dict[str, FileRecord] | None = None,
        published: set[str] | None = None,
    ) -> None:
        """Write ``files`` and ``trainer.pt`` (all durable), then the manifest, then rename.
        ``published``: files the ranks already uploaded (see :meth:`_publish_shards`)."""
        buffer = io.BytesIO()
        torch.save(trainer, buffer)
        files = {**(files or {}), "trainer.pt": [buffer.getbuffer()]}
        blocked = {tmp / name: chunks for name, chunks in files.items()}
        written = write_files_blocked(blocked, block_bytes=BLOCK_BYTES)
        records = {
            **(records or {}),
            **{
                name: FileRecord(
                    bytes=written[tmp / name][1],
                    block_bytes=BLOCK_BYTES,
                    blocks=written[tmp / name][0],
                )
                for name in files
            },
        }
        manifest.files = records
        faults.emit("save_write")  # the files are written, the commit point is not
        # The lowest format that holds what this save uses, so older paratrain reads the rest:
        # 7 packs the many checksums of sharded files, 6 records a reshard, 5 a mesh (tp, HSDP),
        # 4 per-block checksums.
        blocks = [r.block_bytes for r in records.values() if r.blocks is not None]
        fine = any(size < BLOCK_BYTES for size in blocks if size is not None)
        manifest.format_version = (
            7 if fine else 6 if manifest.trained else 5 if manifest.mesh else 4 if blocks else 3
        )
        manifest.created = time.time()
        text = manifest.to_json().encode()
        # The manifest and its checksum are synced together; the folders after them, at once.
        write_files_blocked(
            {
                tmp / MANIFEST: [memoryview(text)],
                tmp / MANIFEST_CHECKSUM: [memoryview(manifest_checksum(text))],
            }
        )
        folders = {tmp, *((tmp / name).parent for name in records)}
        in_parallel([functools.partial(fsync_dir, folder) for folder in folders])
        os.rename(tmp, final)  # the commit point
        fsync_dir(final.parent)
        self._committed(final, manifest, published or set())

    def commit_written(
        self,
        manifest: Manifest,
        tmp: Path,
        final: Path,
        trainer: dict[str, Any],
        records: dict[str, FileRecord],
    ) -> None:
        """Commit files already written (and recorded) into ``tmp``, as a save does: write
        ``trainer.pt``, then the manifest, then rename ``tmp`` to ``final`` (one process)."""
        self._commit(manifest, tmp, final, trainer, records=records)

    def _publish_shards(self, tmp: Path, final: Path, written: dict[str, FileRecord]) -> str | None:
        """Every rank, after its DCP shards (``written``, inside ``tmp/dcp``) are on disk and
        before rank 0 commits: nothing here (a store on object storage uploads them). Returns
        what went wrong, or None; a failure on any rank fails the save on every rank."""
        return None

    def _committed(self, final: Path, manifest: Manifest, published: set[str]) -> None:
        """Rank 0, right after ``final`` was committed: rotate old checkpoints."""
        self._rotate(manifest.lineage, keep=final)

    def _rotate(self, lineage: str, *, keep: Path) -> None:
        """Delete this lineage's checkpoints beyond ``keep_last``, in a thread of its own
        (freeing large files takes the file system a while; training need not wait). Each is
        renamed out of sight first, so no reader sees it half deleted."""
        if self.keep_last is None:
            return
        own = [p for p, m in self._listed() if m is not None and m.lineage == lineage]
        doomed = []
        for old in own[max(self.keep_last, 1) :]:  # never the newest, never one just written
            if old != keep:
                hidden = old.with_name(f".tmp-deleting-{old.name}-{time.time_ns()}")
                try:
                    old.rename(hidden)  # .tmp-* folders are removed by the next save if need be
                except OSError:
                    continue
                doomed.append(hidden)
        if doomed:
            self._deleting = threading.Thread(
                target=_remove_all,
                args=(doomed,),
                name="paratrain-rotate",
                daemon=False,
            )
            self._deleting.start()

    def _start(self, work: Callable[[], object]) -> None:
        pending = self._pending

        def run() -> None:
            try:
                work()
            except BaseException as err:  # reported by wait()
                pending.error.append(err)

        pending.thread = threading.Thread(target=run, name="paratrain-async-save", daemon=False)
        pending.thread.start()

    def wait(self) -> None:
        """Block until an in-flight asynchronous save is committed and old checkpoints are
        deleted; re-raise the save's error."""
        if self._deleting is not None:
            self._deleting.join()
            self._deleting = None
        pending, self._pending = self._pending, _Pending()
        if pending.thread is not None:
            pending.thread.join()
        if pending.error:
            raise CheckpointError(f"The asynchronous save failed: {pending.error[0]}") from None

    # -- finding and loading ------------------------------------------------------------------
    def committed(self) -> list[Path]:
        """Committed checkpoint folders, newest save first."""
        return [p for p, _ in self._listed()]

    def _listed(self) -> list[tuple[Path, Manifest | None]]:
        """Committed folders with their manifests (None: unreadable), newest save first."""
        if not self.directory.is_dir():
            return []
        found: list[tuple[float, str, Path, Manifest | None]] = []
        for folder in self.directory.glob(f"{PREFIX}*"):
            if not (folder / MANIFEST).is_file():
                continue
            try:
                manifest: Manifest | None = Manifest.read(folder)
            except CheckpointError:
                manifest = None
            created = manifest.created if manifest is not None else folder.stat().st_mtime
            found.append((created, folder.name, folder, manifest))
        found.sort(key=lambda item: (item[0], item[1]), reverse=True)
        return [(folder, manifest) for _, _, folder, manifest in found]

    def latest_valid(self) -> tuple[Path, Manifest] | None:
        """Newest checkpoint whose manifest reads and whose files verify; warns about others."""
        for folder, manifest in self.candidates():
            problems = manifest.verify(folder)
            if not problems:
                return folder, manifest
            self.warn(f"skipping {folder}: {'; '.join(problems)}")
        return None

    def candidates(self) -> list[tuple[Path, Manifest]]:
        """Committed checkpoints whose manifest reads, newest first; warns about the others."""
        found = []
        for folder in self.committed():
            try:
                found.append((folder, Manifest.read(folder)))
            except CheckpointError as err:
                self.warn(f"skipping {folder}: {err}")
        return found

    @staticmethod
    def read(folder: Path, manifest: Manifest, adopt: Collection[str] = ()) -> Staged:
        """Every file of a checkpoint read once and checked (:func:`restore.read_checkpoint`;
        ``adopt``: the model files to read into fresh tensors for the models to take)."""
        return read_checkpoint(folder, manifest, adopt)


def _records_of(folder: Path, known: dict[str, FileRecord]) -> dict[str, FileRecord]:
    """The record of every file under ``folder / "dcp"``: made while it was written
    (``known``), or read back for any file the writers did not record. A recorded file that is
    not here (written into another machine's staging folder) keeps its record."""
    found = {str(p.relative_to(folder)): p for p in (folder / "dcp").rglob("*") if p.is_file()}
    records = {
        name: known.get(name) or FileRecord(xxh3_64=checksum_file(path), bytes=path.stat().st_size)
        for name, path in found.items()
    }
    return dict(sorted({**known, **records}.items()))


STAGE_THREADS = min(4, os.cpu_count() or 1)
"""Threads copying the state into the staging buffers of ``async_save`` on the CPU."""
_STAGE_PIECE = 8 * 2**20


def _remove_all(folders: list[Path]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def copy_in_parallel(copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """``dst.copy_(src)`` for every pair, in pieces of 8 MiB spread over threads (``copy_``
    releases the GIL): a memory copy runs at several cores' bandwidth, not one's."""
    pieces: list[tuple[torch.Tensor, torch.Tensor]] = []
    for dst, src in copies:
        if dst.is_contiguous() and src.is_contiguous() and dst.nbytes > _STAGE_PIECE:
            flat_dst, flat_src = dst.view(-1), src.view(-1)
            step = _STAGE_PIECE // dst.element_size()
            pieces += [
                (flat_dst[i : i + step], flat_src[i : i + step])
                for i in range(0, flat_dst.numel(), step)
            ]
        else:
            pieces.append((dst, src))
    total = sum(dst.nbytes for dst, _ in pieces)
    threads = min(STAGE_THREADS, max(1, total // _STAGE_PIECE))
    if threads <= 1:
        for dst, src in pieces:
            dst.copy_(src)
        return
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(lambda pair: pair[0].copy_(pair[1]), pieces):
            pass


def _collect_tensors(tree: Any, out: list[torch.Tensor]) -> None:
    if isinstance(tree, torch.Tensor):
        out.append(tree)
    elif isinstance(tree, dict):
        for value in tree.values():
            _collect_tensors(value, out)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            _collect_tensors(value, out)


_HOST = socket.gethostname().replace("-", "_") or "host"
"""This machine, as it appears in the name of a save in progress (``.tmp-NAME-HOST-PID-NS``)."""


def staging_folder(final: Path) -> Path:
    """Where a save to ``final`` is written before its commit: ``.tmp-NAME-HOST-PID-NS`` beside
    it, which a later save removes once this process is gone (see :func:`_abandoned`)."""
    return final.with_name(f".tmp-{final.name}-{_HOST}-{os.getpid()}-{time.time_ns()}")


ABANDONED_AFTER_S = 6 * 3600
"""A save in progress of another machine (or of an older format) older than this is taken as
abandoned: no save takes hours, and its owner cannot be asked."""


def _abandoned(folder: Path) -> bool:
    """Whether ``folder`` (``.tmp-*``) is left over by a save that no longer runs: a rotation's
    doomed folder; a save of a process of this machine that has exited; or one older than
    :data:`ABANDONED_AFTER_S`. Another job's save in progress in a shared ``ckpt_dir`` is kept."""
    if folder.name.startswith(".tmp-deleting-"):
        return True
    parts = folder.name.rsplit("-", 3)
    if len(parts) == 4 and parts[1] == _HOST and parts[2].isdigit():
        pid = int(parts[2])
        if pid == os.getpid():
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    try:
        return time.time() - folder.stat().st_mtime > ABANDONED_AFTER_S
    except OSError:
        return False
