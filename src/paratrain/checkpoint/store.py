"""Checkpoint folders on disk: crash-safe commit, verification, rotation, and loading.

    store = CheckpointStore(Path("runs/exp/checkpoints"), keep_last=3)
    store.save(request)              # collective; new temp folder -> fsync -> manifest -> rename
    found = store.latest_valid()     # newest save whose manifest and checksums verify
    trainer = load_trainer(folder)
    store.load_unit(folder, "model", target, [optimizer], sharded=False, trainer=trainer)

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

import datetime
import functools
import io
import os
import re
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim import Optimizer

from paratrain import faults
from paratrain.checkpoint import state as st
from paratrain.checkpoint.dcp_io import RecordingWriter, SafePlanner, SafeReader, read_metadata
from paratrain.checkpoint.durable_writes import fsync_dir, in_parallel, write_files_blocked
from paratrain.checkpoint.formats import describe
from paratrain.checkpoint.manifest import (
    MANIFEST,
    MANIFEST_CHECKSUM,
    FileRecord,
    Manifest,
    manifest_checksum,
)
from paratrain.checkpoint.safetensors_io import (
    StoredTensor,
    safetensors_chunks,
    safetensors_entries,
    safetensors_header_bytes,
    tensors_from_safetensors,
)
from paratrain.checkpoint.verified_reads import (
    BLOCK_BYTES,
    WINDOW_BYTES,
    checksum_file,
    read_windows_verified,
)
from paratrain.errors import CheckpointDamagedError, CheckpointError

PREFIX = "step-"


@dataclass(kw_only=True)
class SaveRequest:
    """What one save writes."""

    units: list[tuple[str, nn.Module, list[Optimizer]]]
    """(name, unwrapped model, its optimizers) for every model."""
    trainer: dict[str, Any]
    """Plain data: loop, loaders, schedulers, scaler, extras, and this rank's RNG states under
    ``"rng"``, which the store gathers from every rank (rank ``r``'s at index ``r``)."""
    manifest: Manifest
    sharded: bool
    gather: Callable[[], dict[str, Any]] | None = None
    """Collective: more trainer entries, made once every rank is known to be saving."""


@dataclass
class _Pending:
    thread: threading.Thread | None = None
    error: list[BaseException] = field(default_factory=list)


def _flat_optimizer(folder: Path, optim_stem: str) -> bool:
    """True when the DCP checkpoint in ``folder`` keys optimizer settings by parameter name
    (a pipeline wrote it) rather than by group (``<stem>.param_groups.<i>.params`` lists)."""
    grouped = re.compile(rf"{re.escape(optim_stem)}\.param_groups\.\d+\.params")
    keys = read_metadata(folder / "dcp").state_dict_metadata
    return not any(grouped.fullmatch(key) for key in keys)


def stems(name: str) -> tuple[str, str]:
    """(model file stem, optimizer file stem) of the model called ``name``."""
    if name == "model":
        return "model", "optimizer"
    return f"model.{name}", f"optimizer.{name}"


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
    def save(self, request: SaveRequest, *, background: bool = False) -> Path | None:
        """Write and commit a checkpoint (collective). Returns its folder (None if skipped)."""
        self.wait()
        self._check_every_rank_called()
        if request.gather is not None:
            request.trainer.update(request.gather())
        rank = dist.get_rank() if distributed() else 0
        final, tmp = self._agree_on_folder(request.manifest.step)
        # Pipeline stages hold different parameters: optimizer settings are saved per parameter
        # name (not per group, whose entries would differ from rank to rank and collide).
        mesh = request.manifest.mesh or {}
        flat = request.sharded and mesh.get("pp", 1) > 1
        states = {
            name: st.collect(
                target, optimizers, full=not request.sharded, offload=not background, flat=flat
            )
            for name, target, optimizers in request.units
        }
        rng = _gather_rng(request.trainer.pop("rng"))
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
                buffer = torch.empty(tree.shape, dtype=tree.dtype, pin_memory=tree.is_cuda)
                self._staging[path] = buffer
            if copies is None:
                return buffer.copy_(tree.detach(), non_blocking=tree.is_cuda)
            copies.append((buffer, tree.detach()))
            return buffer
        if isinstance(tree, dict):
            return {k: self._copy_tree(v, f"{path}/{k}", copies) for k, v in tree.items()}
        if type(tree) in (list, tuple):
            return type(tree)(self._copy_tree(v, f"{path}/{i}", copies) for i, v in enumerate(tree))
        return tree

    def _check_every_rank_called(self) -> None:
        if not distributed():
            return
        try:
            dist.monitored_barrier(
                timeout=datetime.timedelta(seconds=self.check_timeout_s), wait_all_ranks=True
            )
        except RuntimeError as err:
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
                shutil.rmtree(stale, ignore_errors=True)  # an interrupted save's leftovers
            final = self.directory / f"{PREFIX}{step:08d}"
            k = 1
            while final.exists():  # a second save at this step: a new folder, newer wins
                final, k = self.directory / f"{PREFIX}{step:08d}.{k}", k + 1
            tmp = self.directory / f".tmp-{final.name}-{os.getpid()}-{time.time_ns()}"
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
            files[f"{model_stem}.safetensors"] = safetensors_chunks(model_sd)
            tensors, metas[name] = st.flatten_optimizer(optim_sd)
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
        # 5 records a mesh (tp, HSDP), 4 per-block checksums.
        blocks = any(r.blocks is not None for r in records.values())
        manifest.format_version = 5 if manifest.mesh else 4 if blocks else 3
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
    def read(folder: Path, manifest: Manifest) -> Staged:
        """Every file of a checkpoint read once and checked against the manifest.

        Optimizer and trainer files come back as buffers to load from (the optimizer keeps views
        of them). A model's safetensors file checked per block is read and verified through a
        small reused buffer here, and copied into the model by :meth:`load_unit` in a second
        pass over the page cache: no fresh copy of the weights, and a damaged file is found
        before any of its bytes reach the model. A DCP folder's shards are only checked for
        presence and size here: each rank reads only its part of them, verified as DCP loads
        it (see SafeReader). Raises CheckpointDamagedError for a damaged file.
        """
        whole, checked = [], []
        for name, record in manifest.files.items():
            if name.startswith("dcp/") and name != "dcp/.metadata":
                problem = _size_problem(folder / name, record.bytes)
                if problem:
                    raise CheckpointDamagedError(problem)
            elif _model_in_windows(name, record):
                checked.append(name)
            else:
                whole.append(name)
        # All files at once: on a cold cache the disk then has several files' reads queued.
        with ThreadPoolExecutor(max(1, min(4, len(whole) + len(checked)))) as pool:
            verified = [
                pool.submit(_verify, folder / name, manifest.files[name]) for name in checked
            ]
            read = pool.map(lambda name: manifest.files[name].read(folder / name), whole)
            buffers = dict(zip(whole, read, strict=True))
            for future in verified:
                future.result()
        return Staged(folder, manifest, buffers)

    def load_unit(
        self,
        staged: Staged,
        name: str,
        target: nn.Module,
        optimizers: list[Optimizer],
        *,
        trainer: dict[str, Any],
        partial: bool = False,
    ) -> None:
        """Restore the model saved as ``name`` (and its optimizers) from a read checkpoint.
        ``partial``: ``target`` holds some of the saved model's layers (pipeline stages)."""
        folder = staged.folder
        model_stem, optim_stem = stems(name)
        if (folder / "dcp").is_dir():
            flat = _flat_optimizer(folder, optim_stem)
            model_sd, optim_sd = st.collect(target, optimizers, full=False, flat=flat)
            state: dict[str, Any] = {model_stem: model_sd}
            if optim_sd:
                state[optim_stem] = optim_sd
            records = {
                name[len("dcp/") :]: record
                for name, record in staged.manifest.files.items()
                if name.startswith("dcp/")
            }
            reader = SafeReader(str(folder / "dcp"), records)
            try:
                with warnings.catch_warnings():  # one process reading shards is intended
                    warnings.filterwarnings("ignore", "torch.distributed is disabled")
                    dcp_load(state, storage_reader=reader, planner=SafePlanner())
            except CheckpointException as err:
                raise _dcp_failure(folder, err) from None
            optim_state = state.get(optim_stem, {})
            st.apply(target, optimizers, state[model_stem], optim_state, full=False, flat=flat)
            return
        model_file = f"{model_stem}.safetensors"
        record = staged.manifest.files.get(model_file)
        loader = None
        if record is not None and _model_in_windows(model_file, record):
            loader = st.ModuleLoader.of(target, partial=partial)  # None: torch loads it whole
        whole_model = staged.tensors(model_file) if loader is None else None
        metas = trainer["optimizer_meta"]
        meta = metas if "param_groups" in metas else metas[name]  # format 1: one optimizer
        optim_sd = st.unflatten_optimizer(staged.tensors(f"{optim_stem}.safetensors"), meta)
        if partial:
            whole_model, optim_sd = st.part_of(target, whole_model, optim_sd)
        if loader is not None:
            assert record is not None
            _load_model_in_windows(folder / model_file, record, loader)
        st.apply(target, optimizers, whole_model, optim_sd, full=True)


@dataclass
class Staged:
    """A checkpoint whose files were read once and verified (see :meth:`CheckpointStore.read`).

    The optimizer state it hands out are views of its buffers, kept by the optimizer: no copy.
    Each view keeps its whole file's buffer alive (until the optimizer's state is replaced), and
    ``torch.save`` of one such tensor alone writes that buffer: ``.clone()`` it first.
    """

    folder: Path
    manifest: Manifest
    buffers: dict[str, torch.Tensor]
    """Replicated files' bytes; a DCP folder's shards are verified as DCP reads them."""

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        """The tensors of the safetensors file ``name`` (read whole and verified now if it was
        only checked, to be copied into the model in windows)."""
        if name not in self.buffers:
            record = self.manifest.files.get(name)
            if record is None:
                raise CheckpointError(f"{self.folder} has no {name}: the checkpoint is incomplete.")
            self.buffers[name] = record.read(self.folder / name)
        return tensors_from_safetensors(self.buffers[name], name)

    def trainer(self) -> dict[str, Any]:
        """``trainer.pt``, loaded with ``weights_only=True``."""
        raw = self.buffers.get("trainer.pt")
        source: Any = io.BytesIO(raw.numpy().tobytes()) if raw is not None else None
        return load_trainer(self.folder, source)


def load_trainer(folder: Path, source: Any = None) -> dict[str, Any]:
    """``trainer.pt`` of a checkpoint (or ``source``, its bytes), with ``weights_only=True``."""
    try:
        data: dict[str, Any] = torch.load(
            folder / "trainer.pt" if source is None else source, weights_only=True
        )
    except Exception as err:
        raise CheckpointError(
            f"{folder / 'trainer.pt'} cannot be loaded safely ({err}). If it holds extras of "
            "your own classes, load them yourself with torch.load(..., weights_only=False) "
            "only if you trust the file."
        ) from None
    return data


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


def _model_in_windows(name: str, record: FileRecord) -> bool:
    """Whether a checkpoint file is a model's weights checked per block (copied into the model
    window by window by :func:`_load_model_in_windows`)."""
    return record.blocks is not None and name.startswith("model") and name.endswith(".safetensors")


def _verify(path: Path, record: FileRecord) -> None:
    """Read ``path`` once through a small buffer and check every block (CheckpointDamagedError)."""
    assert record.blocks is not None and record.block_bytes is not None
    size, window = record.bytes, WINDOW_BYTES
    pieces = [(start, min(window, size - start)) for start in range(0, size, window)]
    for _ in read_windows_verified(
        path, size, record.block_bytes, record.blocks, pieces, window_bytes=window
    ):
        pass


def _load_model_in_windows(path: Path, record: FileRecord, loader: st.ModuleLoader) -> None:
    """Copy a model's safetensors file (verified by :meth:`CheckpointStore.read`) into the
    model window by window: each window of the file is read into one reused buffer, its blocks
    checked again, and copied into the model's tensors, so no second copy of the weights is
    made in fresh memory. Names and shapes are checked before the first byte is loaded."""
    assert record.blocks is not None and record.block_bytes is not None

    def windows(
        ranges: list[tuple[int, int]], window: int = WINDOW_BYTES
    ) -> Iterator[tuple[torch.Tensor, int, list[int]]]:
        assert record.blocks is not None and record.block_bytes is not None
        return read_windows_verified(
            path,
            record.bytes,
            record.block_bytes,
            record.blocks,
            ranges,
            window_bytes=window,
        )

    first, _, _ = next(iter(windows([(0, 8)])))
    length = safetensors_header_bytes(first.numpy().data, record.bytes, path.name)
    header = first if 8 + length <= first.numel() else next(iter(windows([(0, 8 + length)])))[0]
    entries = safetensors_entries(header.numpy().data[8 : 8 + length], record.bytes, path.name)
    loader.check({e.name: e.shape for e in entries})
    entries = [e for e in entries if loader.keeps(e.name)]  # a pipeline stage's own
    modules: dict[str, list[StoredTensor]] = {}  # a module's tensors load together (its hooks)
    for entry in entries:
        modules.setdefault(entry.name.rpartition(".")[0], []).append(entry)
    groups = list(modules.values())
    spans = [
        (min(e.start for e in g), max(e.start + e.nbytes for e in g) - min(e.start for e in g))
        for g in groups
    ]
    window = max(WINDOW_BYTES, record.bytes // 64)  # a few dozen loads for a large model
    for buffer, base, members in windows(spans, window):
        loader.load({e.name: e.view(buffer, base) for i in members for e in groups[i]})


def _size_problem(path: Path, size: int) -> str | None:
    try:
        actual = path.stat().st_size
    except OSError as err:
        return f"{path.name} cannot be read ({err.strerror or err})"
    return None if actual == size else f"{path.name} has {actual} bytes, expected {size}"


def _dcp_failure(folder: Path, err: CheckpointException) -> CheckpointError:
    """The error to raise for a failed DCP load (on every rank alike: DCP gathers failures)."""
    causes = [exc for exc, _ in err.failures.values()]
    for kind in (CheckpointDamagedError, CheckpointError):
        ours = [exc for exc in causes if isinstance(exc, kind)]
        if ours:
            return kind(f"{folder}: {ours[0]}")
    detail = "; ".join(describe(exc) for exc in causes)
    return CheckpointDamagedError(f"{folder}/dcp could not be read ({detail})")


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


def _gather_rng(local: Any) -> list[Any]:
    if not distributed():
        return [local]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, local)
    return out


def _collect_tensors(tree: Any, out: list[torch.Tensor]) -> None:
    if isinstance(tree, torch.Tensor):
        out.append(tree)
    elif isinstance(tree, dict):
        for value in tree.values():
            _collect_tensors(value, out)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            _collect_tensors(value, out)
