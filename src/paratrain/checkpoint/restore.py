"""Reading a checkpoint back: every file verified once (:func:`read_checkpoint`), then a model and
its optimizers restored from it (:func:`load_unit`), straight into their tensors.

    staged = read_checkpoint(folder, Manifest.read(folder))   # CheckpointDamagedError if damaged
    load_unit(staged, "model", model, [optimizer], trainer=staged.trainer())

The writing side is :mod:`paratrain.checkpoint.store`.
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.optim import Optimizer

from paratrain.checkpoint import state as st
from paratrain.checkpoint.dcp_io import SafePlanner, SafeReader, read_metadata
from paratrain.checkpoint.formats import describe
from paratrain.checkpoint.manifest import (
    FileRecord,
    Manifest,
)
from paratrain.checkpoint.safetensors_io import (
    StoredTensor,
    safetensors_entries,
    safetensors_header_bytes,
)
from paratrain.checkpoint.tensor_reads import read_tensors_verified
from paratrain.checkpoint.verified_reads import (
    WINDOW_BYTES,
    map_windows_verified,
    read_windows_verified,
)
from paratrain.errors import CheckpointDamagedError, CheckpointError


def _flat_optimizer(keys: Collection[str], optim_stem: str) -> bool:
    """True when a DCP checkpoint with these ``keys`` keys optimizer settings by parameter name
    (a pipeline wrote it) rather than by group (``<stem>.param_groups.<i>.params`` lists)."""
    grouped = re.compile(rf"{re.escape(optim_stem)}\.param_groups\.\d+\.params")
    return not any(grouped.fullmatch(key) for key in keys)


def _state_keys(optim_sd: dict[str, Any]) -> int:
    """How many per-parameter state entries an optimizer state holds (nested or flat)."""
    nested = optim_sd.get("state")
    if isinstance(nested, dict):
        return sum(len(v) for v in nested.values() if isinstance(v, dict))
    return sum(1 for k in optim_sd if k.startswith("state."))


def _saved_state_only(
    optim_sd: dict[str, Any], keys: Collection[str], optim_stem: str, *, flat: bool
) -> dict[str, Any]:
    """The load target of an optimizer cut to the per-parameter state the checkpoint holds: an
    optimizer saved before its first step has none, and resumes with none."""
    if flat:
        return {
            k: v
            for k, v in optim_sd.items()
            if not k.startswith("state.") or f"{optim_stem}.{k}" in keys
        }
    state = {}
    for fqn, entries in optim_sd.get("state", {}).items():
        kept = {k: v for k, v in entries.items() if f"{optim_stem}.state.{fqn}.{k}" in keys}
        if kept:
            state[fqn] = kept
    return {**optim_sd, "state": state}


def _state_targets(
    optim_sd: dict[str, Any], model_sd: dict[str, Any], stored: dict[str, Any], optim_stem: str
) -> tuple[dict[str, Any], bool] | None:
    """The load target of an optimizer without state yet: for each entry the checkpoint holds
    (``<stem>.state.<fqn>.<entry>``), an uninitialised tensor laid out as its parameter (a
    DTensor's shards for a DTensor), or a scalar; ``(target, some parameter has no saved
    state)``. None when the optimizer has state already, or an entry is neither shaped as its
    parameter nor a scalar (torch then lays the state out itself, by a step on zero gradients).
    Allocating the state directly writes each byte once, where that step writes zero
    gradients and copies them before the load overwrites both."""
    if not optim_sd or optim_sd.get("state"):
        return None
    grouped = [fqn for group in optim_sd.get("param_groups", []) for fqn in group["params"]]
    saved: dict[str, list[tuple[str, Any]]] = {}  # fqn -> its entries: one pass over the keys
    prefix = f"{optim_stem}.state."
    for key, md in stored.items():
        if key.startswith(prefix):
            fqn, _, entry = key[len(prefix) :].rpartition(".")
            saved.setdefault(fqn, []).append((entry, md))
    state: dict[str, dict[str, Any]] = {}
    for fqn in grouped:
        for entry, md in saved.get(fqn, []):
            param = model_sd.get(fqn)
            size = getattr(md, "size", None)
            if size is None:  # a value that is not a tensor: DCP loads it in place
                state.setdefault(fqn, {})[entry] = None
            elif param is not None and tuple(size) == tuple(param.shape) and len(size):
                dtype = md.properties.dtype
                state.setdefault(fqn, {})[entry] = torch.empty_like(param, dtype=dtype)
            elif not len(size):
                state.setdefault(fqn, {})[entry] = torch.empty((), dtype=md.properties.dtype)
            else:
                return None
    partial = any(fqn not in state for fqn in grouped)
    return {**optim_sd, "state": state}, partial


def stems(name: str) -> tuple[str, str]:
    """(model file stem, optimizer file stem) of the model called ``name``."""
    if name == "model":
        return "model", "optimizer"
    return f"model.{name}", f"optimizer.{name}"


@dataclass
class Staged:
    """A checkpoint whose files were read once and verified (see :meth:`CheckpointStore.read`).

    Optimizer files (and the model files of models on the CPU) were read into one fresh tensor
    per entry: the optimizer keeps them as its state, the model takes them as its storage
    (:meth:`ModuleLoader.adopt`), with no copy.
    """

    folder: Path
    manifest: Manifest
    buffers: dict[str, torch.Tensor]
    """Other replicated files' bytes (``trainer.pt``); a DCP folder's shards are verified as
    DCP reads them."""
    files: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    """The tensors of the safetensors files read whole, by file name."""

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        """The tensors of the safetensors file ``name``, each in a storage of its own (read and
        verified now if it was only checked: a model that torch loads whole)."""
        if name not in self.files:
            record = self.manifest.files.get(name)
            if record is None:
                raise CheckpointError(f"{self.folder} has no {name}: the checkpoint is incomplete.")
            self.files[name] = read_tensors_verified(self.folder / name, record)
        return self.files[name]

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
    model window by window, straight from the page cache: each window's blocks are checked
    again, one window ahead of the copy, and no second copy of the weights is made in fresh
    memory. Names and shapes are checked before the first byte is loaded."""
    assert record.blocks is not None and record.block_bytes is not None
    blocks, digests = record.block_bytes, record.blocks

    def head(length: int) -> torch.Tensor:
        reader = read_windows_verified(path, record.bytes, blocks, digests, [(0, length)])
        return next(iter(reader))[0]

    first = head(8)
    length = safetensors_header_bytes(first.numpy().data, record.bytes, path.name)
    header = first if 8 + length <= first.numel() else head(8 + length)
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
    for view, base, members in map_windows_verified(
        path, record.bytes, blocks, digests, spans, window_bytes=window
    ):
        loader.load({e.name: e.view(view, base) for i in members for e in groups[i]})


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


def read_checkpoint(folder: Path, manifest: Manifest, adopt: Collection[str] = ()) -> Staged:
    """Every file of a checkpoint read once and checked against the manifest.

    Optimizer files, and the model files named in ``adopt`` (models on the CPU, which take the
    tensors as they are), are read into one fresh tensor per entry. Any other model file
    checked per block is only verified here, through a small reused buffer, and copied into
    the model by :func:`load_unit` straight from the page cache: no fresh copy of the weights
    (on a GPU, say). Either way a damaged file is found before any of its bytes reach the
    model. A DCP folder's shards are only checked for presence and size here: each rank reads
    only its part of them, verified as DCP loads it (see SafeReader). Raises
    CheckpointDamagedError for a damaged file.
    """
    tensors, checked, whole = [], [], []
    for name, record in manifest.files.items():
        if name.startswith("dcp/") and name != "dcp/.metadata":
            problem = _size_problem(folder / name, record.bytes)
            if problem:
                raise CheckpointDamagedError(problem)
        elif _model_in_windows(name, record) and name not in adopt:
            checked.append(name)
        elif name.endswith(".safetensors") and name.startswith(("model", "optimizer")):
            tensors.append(name)
        else:
            whole.append(name)
    # All files at once: on a cold cache the disk then has several files' reads queued.
    with ThreadPoolExecutor(max(1, min(4, len(tensors) + len(checked) + len(whole)))) as pool:
        verified = [pool.submit(_verify, folder / name, manifest.files[name]) for name in checked]
        into = {
            name: pool.submit(read_tensors_verified, folder / name, manifest.files[name])
            for name in tensors
        }
        read = pool.map(lambda name: manifest.files[name].read(folder / name), whole)
        buffers = dict(zip(whole, read, strict=True))
        files = {name: future.result() for name, future in into.items()}
        for future in verified:
            future.result()
    return Staged(folder, manifest, buffers, files)


def load_unit(
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
        stored = read_metadata(folder / "dcp").state_dict_metadata
        keys = set(stored)
        flat = _flat_optimizer(keys, optim_stem)
        model_sd, optim_sd = st.collect(target, optimizers, full=False, flat=flat)
        state: dict[str, Any] = {model_stem: model_sd}
        partial_state = False
        built = None if flat else _state_targets(optim_sd, model_sd, stored, optim_stem)
        if built is not None:  # a fresh optimizer: its state laid out from the checkpoint
            state[optim_stem], partial_state = built
        elif optim_sd:
            if not flat:  # torch lays the state out by a step on zero gradients
                _, optim_sd = st.collect(target, optimizers, full=False, create=True)
            else:
                _, optim_sd = st.collect(target, optimizers, full=False, flat=True, create=True)
            state[optim_stem] = _saved_state_only(optim_sd, keys, optim_stem, flat=flat)
            partial_state = _state_keys(state[optim_stem]) != _state_keys(optim_sd)
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
        st.apply(
            target,
            optimizers,
            state[model_stem],
            optim_state,
            full=False,
            flat=flat,
            strict_optimizer=not partial_state,
        )
        return
    model_file = f"{model_stem}.safetensors"
    record = staged.manifest.files.get(model_file)
    read = staged.files.get(model_file)  # read into fresh tensors for the model to take
    loader = None
    if read is not None or (record is not None and _model_in_windows(model_file, record)):
        loader = st.ModuleLoader.of(target, partial=partial)  # None: torch loads it whole
    whole_model = staged.tensors(model_file) if loader is None else None
    metas = trainer["optimizer_meta"]
    meta = metas if "param_groups" in metas else metas[name]  # format 1: one optimizer
    optim_sd = st.unflatten_optimizer(staged.tensors(f"{optim_stem}.safetensors"), meta)
    if partial:
        whole_model, optim_sd = st.part_of(target, whole_model, optim_sd)
    if loader is not None and read is not None:
        loader.adopt(read if not partial else {k: v for k, v in read.items() if loader.keeps(k)})
        staged.files.pop(model_file)  # the model holds what it took; the rest can go
    elif loader is not None:
        assert record is not None
        _load_model_in_windows(folder / model_file, record, loader)
    grouped = {n for group in optim_sd.get("param_groups", []) for n in group.get("params", [])}
    st.apply(
        target,
        optimizers,
        whole_model,
        optim_sd,
        full=True,
        strict_optimizer=grouped <= set(optim_sd.get("state", {})),  # else: some never stepped
    )
