"""A whole training state rewritten for another layout or world size, without launching ranks.

    reshard(Path("ckpts/step-00000300"), Path("ckpts-fsdp8"), layout="fsdp", world=8)
    # then: pt.Run(strategy="fsdp", ckpt_dir="ckpts-fsdp8") on 8 ranks resumes from it

The output is a committed paratrain checkpoint, as a job of the target layout would have saved
it: for ``fsdp``, a DCP folder in which rank ``r``'s file holds exactly the rows FSDP gives rank
``r`` (parameters and their optimizer state split along dim 0, other tensors whole, once), so
each rank of the resumed job reads its own file; for ``ddp`` and ``single``, one
``model.safetensors`` and one ``optimizer.safetensors``. Schedulers, counters, loader positions,
extras and every rank's random generators are copied as they are: the manifest records the
layout that trained them (``trained``), and a resume treats them exactly as a resume from the
original checkpoint would (restored when the job has that layout, re-derived from (seed, step,
rank) otherwise). So a job resumes from the output as it would from the input.

One tensor is read at a time (from a DCP input: viewed in its mapped files, its pieces
assembled; compressed ones read in groups of at most 256 MiB) and written to every rank's file
that holds part of it: memory stays near the largest tensor, whatever the size of the
checkpoint. The input is verified against its manifest first; nothing is left at the output
on an error.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint._nested_dict import unflatten_state_dict
from torch.distributed.checkpoint.metadata import (
    TensorStorageMetadata,
)

from paratrain.checkpoint.dcp_io import (
    DcpTensors,
    RecordingWriter,
    read_metadata,
    zip_crc_skipped,
)
from paratrain.checkpoint.dcp_writer import Ref, write_dcp
from paratrain.checkpoint.manifest import MANIFEST, FileRecord, Manifest
from paratrain.checkpoint.mapped_dcp import MappedDcp
from paratrain.checkpoint.restore import _flat_optimizer, load_trainer, stems
from paratrain.checkpoint.safetensors_io import StoredTensor, file_entries
from paratrain.checkpoint.state import flatten_optimizer, unflatten_optimizer
from paratrain.checkpoint.store import CheckpointStore, staging_folder
from paratrain.checkpoint.streamed import Source, write_tensors
from paratrain.core.version import __version__
from paratrain.errors import CheckpointError

LAYOUTS = ("fsdp", "ddp", "single")
"""Target layouts: FSDP over ``world`` ranks (sharded), DDP over ``world`` ranks or one process
(one full copy)."""


def reshard(
    src: Path,
    out: Path,
    *,
    layout: str,
    world: int,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Rewrite the checkpoint ``src`` (a checkpoint folder, or a folder of checkpoints: its
    newest valid one) for ``layout`` at ``world`` ranks, as a new checkpoint inside the
    checkpoint folder ``out`` (created if need be). Returns what was written.
    ``progress(done, total)`` gets the bytes of tensors written so far."""
    if layout not in LAYOUTS:
        raise CheckpointError(
            f"--to-layout {layout!r} is not a layout reshard writes. Use one of "
            f"{', '.join(LAYOUTS)} (tp and pipeline layouts resume from any of them in-job)."
        )
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise CheckpointError(f"--world {world!r} is not a number of ranks: give 1 or more.")
    if layout == "single" and world != 1:
        raise CheckpointError(
            f"--to-layout single is one process, but --world {world} was given. Use "
            f"--to-layout ddp --world {world}, or drop --world."
        )
    _enough_open_files(world if layout == "fsdp" else 1)
    folder, manifest = _source(src)
    if manifest.layout == "sharded" and _reads_pipeline(folder, manifest) and layout != "fsdp":
        raise CheckpointError(
            f"{folder} was saved by pipeline stages, which keep optimizer settings per parameter; "
            "a replicated checkpoint cannot hold them. Reshard it --to-layout fsdp (any layout "
            "resumes from that), or resume it in-job under ddp and save."
        )
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out} is a file. Give a folder for the resharded checkpoint.")
    final = out / folder.name
    if final.exists():
        raise CheckpointError(
            f"{final} already exists. Give another output folder, or move it away; nothing was "
            "written."
        )
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        return _rewrite(folder, manifest, out, final, layout, world, progress)
    except OSError as err:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise CheckpointError(
            f"Resharding {folder} into {final} failed ({err.strerror or err}). Check that the "
            "input can be read and that the output folder is on a writable file system with "
            "room for the checkpoint; nothing was written."
        ) from None
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)  # made here, holding nothing committed
        raise


def _rewrite(
    folder: Path,
    manifest: Manifest,
    out: Path,
    final: Path,
    layout: str,
    world: int,
    progress: Callable[[int, int], None] | None,
) -> dict[str, Any]:
    trainer = load_trainer(folder)
    states, tied = _read_states(folder, manifest, trainer)
    total = sum(r.nbytes for r in _refs(states))
    done = 0

    def wrote(nbytes: int) -> None:
        nonlocal done
        done += nbytes
        if progress is not None:
            progress(done, total)

    store = CheckpointStore(out, keep_last=None, check_timeout_s=0.0, warn=lambda _: None)
    tmp = staging_folder(final)  # left by a crash: removed by the next save into ``out``
    tmp.mkdir()
    try:
        if layout == "fsdp":
            records = {
                f"dcp/{k}": v for k, v in _write_dcp(tmp / "dcp", states, world, wrote).items()
            }
            trainer.pop("optimizer_meta", None)
        else:
            records, trainer["optimizer_meta"] = _write_replicated(tmp, states, tied, wrote)
        target = _target_manifest(manifest, layout, world)
        store.commit_written(target, tmp, final, trainer, records)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "path": str(final),
        "from": f"{manifest.strategy} at {manifest.world_size} rank(s) ({manifest.layout})",
        "to": f"{layout} at {world} rank(s)",
        "tensors": len(_refs(states)),
        "bytes": total,
        "step": manifest.step,
    }


def _enough_open_files(files: int) -> None:
    """An FSDP output keeps one file per rank open: raise this process's soft limit of open
    files to what that needs (within the hard limit), or say how to raise the hard one."""
    try:
        import resource
    except ImportError:  # not a Unix: no such limit to raise
        return
    need = files + 64  # the interpreter's own files beside them
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise CheckpointError(
            f"--world {files} writes {files} files at once, but this process may open only "
            f"{hard}. Raise the limit (`ulimit -n {need}` as root, or in limits.conf) and run "
            "again; nothing was written."
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


# -- the input -------------------------------------------------------------------------------
def _source(src: Path) -> tuple[Path, Manifest]:
    """The checkpoint folder to read and its manifest, verified."""
    src = Path(src)
    if not src.is_dir():
        raise CheckpointError(
            f"{src} is not a folder. Give a paratrain checkpoint folder (step-...) or the "
            "checkpoint directory of a run."
        )
    if not (src / MANIFEST).is_file():
        store = CheckpointStore(src, keep_last=None, check_timeout_s=0.0, warn=lambda _: None)
        found = store.latest_valid()
        if found is None:
            raise CheckpointError(
                f"{src} holds no intact paratrain checkpoint (`paratrain ckpt verify {src}` "
                "says why). Give a checkpoint folder written by pt.Run.save()."
            )
        return found
    manifest = Manifest.read(src)
    problems = _problems(src, manifest)
    if problems:
        raise CheckpointError(
            f"{src} is damaged: {'; '.join(problems)}. Use another checkpoint; nothing was written."
        )
    return src, manifest


def _problems(folder: Path, manifest: Manifest) -> list[str]:
    """What is wrong with the checkpoint's files. DCP shards are only checked for presence and
    size here: DCP's reader verifies each block as it reads it (a second pass would double the
    reading); the others are read raw later, so they are verified now."""
    problems = []
    for name, record in manifest.files.items():
        path = folder / name
        if name.startswith("dcp/") and name != "dcp/.metadata":
            size = path.stat().st_size if path.is_file() else None
            problem = None if size == record.bytes else f"{name} is missing or resized"
        else:
            problem = record.problem(path)
        if problem:
            problems.append(problem.replace(path.name, name, 1))
    return problems


def _reads_pipeline(folder: Path, manifest: Manifest) -> bool:
    keys = set(read_metadata(folder / "dcp").state_dict_metadata)
    return any(
        _flat_optimizer(keys, stems(n)[1]) and _has_optimizer(keys, n) for n in manifest.models
    )


def _has_optimizer(keys: set[str], name: str) -> bool:
    stem = stems(name)[1] + "."
    return any(k.startswith(stem) for k in keys)


States = dict[str, tuple[dict[str, Any], dict[str, Any]]]
"""Model name -> (its state dict, its optimizers' state dict), tensors as :class:`Ref`."""

_TIED = "tied"
"""The header entry of a replicated model file naming its tied weights (kept as it is)."""


def _read_states(
    folder: Path, manifest: Manifest, trainer: dict[str, Any]
) -> tuple[States, dict[str, str]]:
    """The input's states, and the tied-weights entry of each model file that has one."""
    if manifest.layout == "sharded":
        return _dcp_states(folder, manifest), {}
    states: States = {}
    tied: dict[str, str] = {}
    metas = trainer.get("optimizer_meta", {})
    order = 0
    for name in manifest.models:
        model_stem, optim_stem = stems(name)
        model, order, header = _file_refs(folder / f"{model_stem}.safetensors", order)
        if header.get(_TIED):
            tied[f"{model_stem}.safetensors"] = header[_TIED]
        optim_file = folder / f"{optim_stem}.safetensors"
        optim: dict[str, Any] = {}
        if optim_file.is_file():
            tensors, order, _ = _file_refs(optim_file, order)
            meta = metas if "param_groups" in metas else metas.get(name, {})
            optim = unflatten_optimizer(tensors, meta)  # type: ignore[arg-type]
            optim, order = _held_refs(optim, order)  # tensors among the settings (lr, say)
            if not optim["state"] and not optim["param_groups"]:
                optim = {}  # a model without optimizer: its file is empty
        states[name] = (model, optim)
    return states, tied


def _held_refs(tree: Any, order: int) -> tuple[Any, int]:
    """``tree`` with every tensor it holds in memory as a :class:`Ref` (numbered from
    ``order``), so that every tensor of a state is a ref whatever its source."""
    if isinstance(tree, torch.Tensor):
        held = tree

        def read() -> torch.Tensor:
            return held

        return Ref("", tree.dtype, tuple(tree.shape), read, order), order + 1
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out[k], order = _held_refs(v, order)
        return out, order
    if isinstance(tree, list):
        items = []
        for v in tree:
            item, order = _held_refs(v, order)
            items.append(item)
        return items, order
    return tree, order


def _read_refs(tree: Any) -> Any:
    """``tree`` with every :class:`Ref` read (small tensors among plain settings)."""
    if isinstance(tree, Ref):
        return tree.read()
    if isinstance(tree, dict):
        return {k: _read_refs(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_read_refs(v) for v in tree]
    return tree


def _file_refs(path: Path, order: int) -> tuple[dict[str, Ref], int, dict[str, str]]:
    entries, header = file_entries(path)
    listed = {e.name: e for e in entries}
    source = Source(listed, {}, "safetensors", files=dict.fromkeys(listed, path))
    refs = {}
    for entry in entries:
        read = partial(source.read, entry.name)  # a view of the mapped file
        refs[entry.name] = Ref(entry.name, entry.dtype, tuple(entry.shape), read, order)
        order += 1
    return refs, order, dict(header)


def _dcp_states(folder: Path, manifest: Manifest) -> States:
    dcp = folder / "dcp"
    meta = read_metadata(dcp)
    records = {
        name[len("dcp/") :]: record
        for name, record in manifest.files.items()
        if name.startswith("dcp/")
    }
    tensors = DcpTensors(dcp, meta, records)
    mapped = MappedDcp(dcp, meta, records, tensors)
    flat: dict[str, Any] = tensors.load(
        {
            k: None
            for k, md in meta.state_dict_metadata.items()
            if not isinstance(md, TensorStorageMetadata)
        }
    )
    stored: dict[str, int] = {}
    for index in meta.storage_data:
        stored[index.fqn] = stored.get(index.fqn, 0) + 1
    for order, (key, md) in enumerate(meta.state_dict_metadata.items()):
        if isinstance(md, TensorStorageMetadata):
            pieces = [c for c in md.chunks if math.prod(c.sizes)]
            flat[key] = Ref(
                key,
                md.properties.dtype,
                tuple(md.size),
                partial(mapped.read, key),
                order,
                split=len(pieces) > 1,
            )
    nested = unflatten_state_dict(flat, meta.planner_data) if meta.planner_data else flat
    states: States = {}
    for name in manifest.models:
        model_stem, optim_stem = stems(name)
        states[name] = (dict(nested.get(model_stem, {})), dict(nested.get(optim_stem, {})))
    return states


def _refs(states: States) -> list[Ref]:
    found: dict[int, Ref] = {}

    def walk(tree: Any) -> None:
        if isinstance(tree, Ref):
            found[id(tree)] = tree
        elif isinstance(tree, dict):
            for value in tree.values():
                walk(value)
        elif isinstance(tree, (list, tuple)):
            for value in tree:
                walk(value)

    walk(states)
    return sorted(found.values(), key=lambda r: r.order)


# -- a replicated output -----------------------------------------------------------------------
def _write_replicated(
    tmp: Path, states: States, tied: dict[str, str], wrote: Callable[[int], None]
) -> tuple[dict[str, FileRecord], dict[str, Any]]:
    """``model*.safetensors`` and ``optimizer*.safetensors`` as rank 0 of a replicated job
    writes them; returns their records and the optimizers' plain settings."""
    metas: dict[str, Any] = {}
    writer = RecordingWriter(str(tmp))  # its file system hashes each block as it is written
    for name, (model, optim) in states.items():
        model_stem, optim_stem = stems(name)
        tensors, meta = _split_optimizer(optim)
        metas[name] = _read_refs(meta)  # plain data, and tensors among the settings
        # Every model has its optimizer file, empty without an optimizer (as a save writes).
        files = {f"{model_stem}.safetensors": model, f"{optim_stem}.safetensors": tensors}
        for file_name, refs in files.items():
            entries = {
                k: StoredTensor(k, r.dtype, list(r.shape), 0, r.nbytes) for k, r in refs.items()
            }
            header = {_TIED: tied[file_name]} if file_name in tied else None
            with writer.fs.create_stream(tmp / file_name, "wb") as f:
                write_tensors(f, entries, _read_from(refs), metadata=header, wrote=wrote)
                os.fsync(f.fileno())
    return dict(writer.records), metas


def _split_optimizer(optim: dict[str, Any]) -> tuple[dict[str, Ref], dict[str, Any]]:
    """:func:`~paratrain.checkpoint.state.flatten_optimizer` of a state whose tensors are refs."""
    return flatten_optimizer(optim, tensor=lambda value: isinstance(value, Ref))


def _read_from(refs: dict[str, Ref]) -> Callable[[str], torch.Tensor]:
    return lambda key: refs[key].read()


# -- an FSDP output ----------------------------------------------------------------------------
def _sharded(states: States) -> set[int]:
    """ids of the refs FSDP shards: every parameter (a tensor with optimizer state or in a
    parameter group, or one the input held in pieces) and its state of the same shape."""
    sharded: set[int] = set()
    for model, optim in states.values():
        params = {fqn for fqn, ref in model.items() if isinstance(ref, Ref) and ref.split}
        for group in optim.get("param_groups", []):
            params.update(group.get("params", []))
        params.update(optim.get("state", {}))
        flat_keys = [k for k in optim if k.startswith(("state.", "param_groups."))]
        by_name = sorted(model, key=len, reverse=True)
        for key in flat_keys:  # a pipeline's flat optimizer: "state.<fqn>.<entry>"
            rest = key.split(".", 1)[1]
            params.update(f for f in by_name if rest.startswith(f + "."))
        for fqn in params:
            ref = model.get(fqn)
            if not isinstance(ref, Ref) or not ref.shape:
                continue
            sharded.add(id(ref))
            entries = optim.get("state", {}).get(fqn, {})
            entries = {
                **entries,
                **{k: v for k, v in optim.items() if k.startswith(f"state.{fqn}.")},
            }
            for value in entries.values():
                if isinstance(value, Ref) and value.shape == ref.shape:
                    sharded.add(id(value))
    return sharded


def _write_dcp(
    folder: Path, states: States, world: int, wrote: Callable[[int], None]
) -> dict[str, FileRecord]:
    """``states`` as the DCP folder ``world`` FSDP ranks would save (:func:`write_dcp`)."""
    tree: dict[str, Any] = {}
    for name, (model, optim) in states.items():
        model_stem, optim_stem = stems(name)
        tree[model_stem] = model
        if optim:
            tree[optim_stem] = optim
    with zip_crc_skipped():  # the manifest records a checksum of every block, as in a save
        return write_dcp(folder, tree, world=world, sharded=_sharded(states), wrote=wrote)


# -- the manifest -----------------------------------------------------------------------------
def _target_manifest(source: Manifest, layout: str, world: int) -> Manifest:
    trained: dict[str, Any] | None = source.trained or {
        "strategy": source.strategy,
        "world_size": source.world_size,
        "mesh": source.mesh,
    }
    if trained is not None and (trained["world_size"], trained.get("mesh")) == (world, None):
        trained = None  # back at the layout that trained it: its per-rank state fits again
    return Manifest(
        paratrain_version=__version__,
        torch_version=torch.__version__,
        layout="sharded" if layout == "fsdp" else "replicated",
        strategy={"fsdp": "fsdp", "ddp": "ddp", "single": "cpu"}[layout],
        world_size=world,
        mesh=None,
        trained=trained,
        per_rank_batch=source.per_rank_batch,
        grad_accum=source.grad_accum,
        epoch=source.epoch,
        step=source.step,
        samples_in_epoch=source.samples_in_epoch,
        created=0.0,
        run_id=source.run_id,
        lineage=source.lineage,
        models=list(source.models),
    )
