"""What a save writes and a resume restores: every registered piece of the run's state.

    pieces = Pieces(tracked=tracked, loop=loop, precision=precision, layout=layout)
    folder = save(pieces, store, identity, extras={"best": 0.91})     # collective
    resumed = resume(pieces, store, identity, say=print)              # None: nothing to resume

A save records the loop (epoch, step, grad_accum), every training loader's position, every
model with its optimizers, every scheduler and tracked object, the fp16 scaler, every rank's
random generators and the extras. A resume restores all of it; state for something the script
registers only later waits in ``tracked.pending`` and is applied at registration. The continued
run sees the batches the uninterrupted one would have, also at another world size (loader
positions count global samples; generator states that no longer map onto ranks are re-derived
from (seed, step, rank)).

This module is given the pieces explicitly; it knows nothing of :class:`paratrain.Run`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from paratrain.checkpoint.manifest import Manifest
from paratrain.checkpoint.plain_data import plain
from paratrain.checkpoint.restore import Staged, load_trainer, load_unit, stems
from paratrain.checkpoint.state import adoptable, collect
from paratrain.checkpoint.store import CheckpointStore, SaveRequest, distributed
from paratrain.core.version import __version__
from paratrain.data.loader import DeviceLoader
from paratrain.distributed.collectives import gather
from paratrain.errors import CheckpointDamagedError, CheckpointError, ConfigError
from paratrain.runtime.loop_state import LoopState, loop_to_save
from paratrain.runtime.per_rank import extras_of_rank, objects_of_every_rank, per_rank_restorer
from paratrain.runtime.precision import Precision
from paratrain.runtime.registry import Registry, Unit
from paratrain.runtime.rng import capture_rng, reseed_rng, restore_rng

T = TypeVar("T")


@dataclass(kw_only=True)
class Layout:
    """How the running job is laid out (recorded in the manifest, compared on resume)."""

    strategy: str
    world_size: int
    rank: int
    sharded: bool
    """True when every rank writes its shards (FSDP); else rank 0 writes full tensors."""
    mesh: dict[str, int] | None
    """Mesh axes when layers are split or shard groups replicated (tp, HSDP); else None."""
    data_rank: int
    """Which share of the data this rank reads (its random stream follows it)."""
    data_size: int
    seed: int
    unwrap: Any
    """``module -> plain module`` of the strategy."""
    partial: bool = False
    """True when a rank holds some of the model's layers only (pipeline stages)."""


@dataclass(kw_only=True)
class Pieces:
    """Everything a checkpoint holds, handed over explicitly."""

    tracked: Registry
    loop: LoopState
    precision: Precision
    layout: Layout


@dataclass
class Identity:
    """Which run writes: its own id, and the lineage (first fresh run) it continues."""

    run_id: str
    lineage: str


@dataclass(frozen=True)
class Resumed:
    """What :func:`resume` restored."""

    folder: Path
    manifest: Manifest
    extras: dict[str, Any]


def save(
    pieces: Pieces,
    store: CheckpointStore,
    identity: Identity,
    extras: dict[str, Any] | None,
    *,
    background: bool = False,
) -> Path | None:
    """Write a checkpoint of everything registered (collective)."""
    tracked, loop = pieces.tracked, pieces.loop
    if not tracked.units:
        raise ConfigError("run.save() found no model: call run.setup(model, optimizer) first.")
    loaders = tracked.loaders
    driver = next((ld for ld in loaders if ld.continues), loaders[0] if loaders else None)
    saved_loop = loop_to_save(loop, loaders)
    epoch = saved_loop["epoch"]
    per_rank = driver.loader.batch_size if driver is not None else None
    manifest = Manifest(
        paratrain_version=__version__,
        torch_version=torch.__version__,
        layout="sharded" if pieces.layout.sharded else "replicated",
        strategy=pieces.layout.strategy,
        world_size=pieces.layout.world_size,
        mesh=pieces.layout.mesh,
        per_rank_batch=per_rank,
        grad_accum=loop.grad_accum,
        epoch=epoch,
        step=loop.global_step,
        samples_in_epoch=driver.position.samples if driver and driver.continues else 0,
        created=0.0,
        run_id=identity.run_id,
        lineage=identity.lineage,
        models=[u.name for u in tracked.units],
    )
    trainer = {
        "loop": saved_loop,
        "loaders": {ld.name: ld.state_dict() for ld in loaders},
        "streams": _streams_of_every_rank(loaders),
        "schedulers": {k: v.state_dict() for k, v in tracked.schedulers.items()},
        "scaler": pieces.precision.state_dict(),
        "extras": plain(dict(extras or {}), "extras"),
        "rng": capture_rng(),
        "seed": pieces.layout.seed,
        "position": {"epoch": epoch, "step": loop.global_step, "samples_in_epoch": 0},
    }
    store.begin()  # every rank is saving: the collectives below match
    trainer.update(objects_of_every_rank(tracked, trainer["extras"]))
    sharded = pieces.layout.sharded
    # Pipeline stages hold different parameters: optimizer settings are saved per parameter
    # name (not per group, whose entries would differ from rank to rank and collide).
    flat = sharded and (pieces.layout.mesh or {}).get("pp", 1) > 1
    states = {
        u.name: collect(
            pieces.layout.unwrap(u.module),
            u.optimizers,
            full=not sharded,
            offload=not background,
            flat=flat,
        )
        for u in tracked.units
    }
    trainer["rng"] = gather(trainer["rng"])  # [rank] -> that rank's generators
    request = SaveRequest(states=states, trainer=trainer, manifest=manifest, sharded=sharded)
    return store.save(request, background=background)


def _streams_of_every_rank(loaders: list[DeviceLoader[Any]]) -> list[dict[str, Any]]:
    """Every rank's stream positions (``[rank] -> {loader name: state}``); [] without streams.
    Collective when a loader reads a stream (every rank has the same loaders)."""
    local = {
        ld.name: plain(ld.stream_state(), f"the stream position of {ld.name}")
        for ld in loaders
        if ld.stream is not None and ld.train
    }
    return gather(local) if local else []


def resume(
    pieces: Pieces,
    store: CheckpointStore,
    identity: Identity,
    *,
    say: Any,
    warn: Any,
) -> Resumed | None:
    """Restore the newest valid checkpoint, if any (collective). What follows from it (the
    global batch rule, grad_accum) is the caller's: :class:`paratrain.runtime.checkpointer.
    Checkpointer`."""
    if not pieces.tracked.units:
        raise ConfigError(
            "run.resume() needs the model: call run.setup(model, optimizer) first. To read a "
            "checkpoint's extras before building the model, use run.latest_checkpoint()."
        )
    half_loaded: list[Path] = []
    for staged, manifest in _newest_intact(store, warn, adopt=_adopting(pieces)):
        trainer = staged.trainer()
        failure: CheckpointDamagedError | None = None
        try:
            _restore_units(pieces, store, staged, manifest, trainer, warn)
        except CheckpointDamagedError as err:  # a DCP shard, verified as it was loaded
            failure = err
        if _everywhere(failure is None):
            break
        warn(f"skipping {staged.folder}: {failure or 'damaged as loaded by another rank'}")
        half_loaded.append(staged.folder)  # files that verified were loaded already
    else:
        if half_loaded:
            raise CheckpointError(
                f"No intact checkpoint in {store.location}. The damage in "
                f"{', '.join(str(f) for f in half_loaded)} was found while loading it, after "
                "some of its shards had already reached the model and optimizer, so this run "
                "cannot start fresh from its own weights. Move the damaged checkpoint(s) out "
                "of the folder and restart: the run then starts fresh."
            )
        say(f"paratrain: no checkpoint in {store.location}; starting fresh")
        return None
    folder = staged.folder
    layout = pieces.layout
    # Per-rank state belongs to the ranks that trained (a reshard rewrote the tensors alone).
    saved_world, saved_mesh = manifest.trained_at
    same_layout = saved_world == layout.world_size and saved_mesh == layout.mesh
    _restore_rest(pieces, trainer, rank=layout.rank if same_layout else None)
    if same_layout:
        restore_rng(trainer["rng"][layout.rank])
    else:
        reseed_rng(seed=layout.seed, step=pieces.loop.global_step, rank=layout.data_rank)
        saved = _layout_words(saved_world, saved_mesh)
        say(
            f"paratrain: saved at {saved}, resumed at "
            f"{_layout_words(layout.world_size, layout.mesh)}: random generators re-derived "
            "from (seed, step, data rank)"
        )
    identity.lineage = manifest.lineage or manifest.run_id
    origin = (
        "" if manifest.run_id in ("", identity.run_id) else f", written by run {manifest.run_id}"
    )
    say(
        f"paratrain: resumed from {folder} (epoch {pieces.loop.epoch}, step "
        f"{pieces.loop.global_step}{origin}, saved {time.ctime(manifest.created)})"
    )
    extras = extras_of_rank(trainer, layout.rank if same_layout else None, warn)
    return Resumed(folder, manifest, extras)


def _restore_units(
    pieces: Pieces,
    store: CheckpointStore,
    staged: Staged,
    manifest: Manifest,
    trainer: dict[str, Any],
    warn: Any,
) -> None:
    units = _units_by_saved_name(pieces, manifest)
    saved = list(manifest.models)

    def restore(name: str) -> Any:
        def apply(unit: Unit) -> None:
            target = pieces.layout.unwrap(unit.module)
            load_unit(
                staged,
                name,
                target,
                unit.optimizers,
                trainer=trainer,
                partial=pieces.layout.partial,
            )

        return apply

    for name in saved:
        if name in units:
            restore(name)(units[name])
        else:
            pieces.tracked.defer(f"model:{name}", restore(name))
    missing = [n for n in units if n not in saved]
    if missing:
        warn(
            f"model(s) {missing} are not in {staged.folder} (it holds {saved}); they keep their "
            "current weights"
        )


def _restore_rest(pieces: Pieces, trainer: dict[str, Any], *, rank: int | None) -> None:
    """Everything but the models. ``rank``: this rank's stream positions apply (None: saved at
    another layout, where streams continue approximately)."""
    tracked, loop = pieces.tracked, pieces.loop
    if "loop" in trainer:
        loop.load_state_dict(trainer["loop"])
        loaders: dict[str, Any] = trainer.get("loaders", {})
        schedulers: dict[str, Any] = trainer.get("schedulers", {})
        objects: dict[str, Any] = trainer.get("objects", {})
    else:  # format 1: one position, one scheduler
        pos = trainer["position"]
        loop.epoch, loop.global_step = int(pos["epoch"]), int(pos["step"])
        samples = int(pos["samples_in_epoch"])
        loaders = {"loader": {"epoch": loop.epoch, "samples": samples, "finished": False}}
        loaders["loader"]["running"] = samples > 0
        schedulers = {"scheduler": trainer["scheduler"]} if trainer.get("scheduler") else {}
        objects = {}
    by_name = {ld.name: ld for ld in tracked.loaders}
    streams: list[dict[str, Any]] = trainer.get("streams", [])
    loaders = {name: _with_streams(state, name, streams, rank) for name, state in loaders.items()}
    for name, state in loaders.items():
        _apply_or_defer(tracked, "loader", name, by_name.get(name), state)
    for name, state in schedulers.items():
        _apply_or_defer(tracked, "scheduler", name, tracked.schedulers.get(name), state)
    for name, state in objects.items():
        _apply_or_defer(tracked, "object", name, tracked.objects.get(name), state)
    per_rank: dict[str, list[Any]] = trainer.get("objects_per_rank", {})
    for name, states in per_rank.items():
        restore = per_rank_restorer(tracked, name, states, rank)
        if name in tracked.objects:
            restore(tracked.objects[name])
        else:
            tracked.defer(f"object:{name}", restore)
    pieces.precision.load_state_dict(trainer.get("scaler"))


def _with_streams(
    state: dict[str, Any], name: str, streams: list[dict[str, Any]], rank: int | None
) -> dict[str, Any]:
    """A stream loader's position with every saved rank's stream state (``"streams"``), and
    this rank's (``"stream"``) when it applies (``rank``: saved at this layout)."""
    if not any(name in s for s in streams):
        return state
    mine = {"stream": streams[rank][name]} if rank is not None and rank < len(streams) else {}
    return {**state, "streams": [s.get(name) for s in streams], **mine}


def _apply_or_defer(tracked: Registry, kind: str, name: str, obj: Any, state: Any) -> None:
    if obj is not None:
        obj.load_state_dict(state)
    else:
        tracked.defer(f"{kind}:{name}", lambda o: o.load_state_dict(state))


def _layout_words(world_size: int, mesh: dict[str, int] | None) -> str:
    if not mesh:
        return f"world size {world_size}"
    axes = " x ".join(f"{axis} {size}" for axis, size in mesh.items() if size > 1)
    return f"world size {world_size} ({axes or 'one rank'})"


@dataclass(frozen=True)
class CheckpointInfo:
    """The newest valid checkpoint, read without a model (see ``run.latest_checkpoint``)."""

    folder: Path
    manifest: Manifest
    extras: dict[str, Any]

    @property
    def step(self) -> int:
        """Optimizer steps taken when it was saved."""
        return self.manifest.step

    @property
    def epoch(self) -> int:
        """Epoch it continues in."""
        return self.manifest.epoch


def latest(store: CheckpointStore, rank: int) -> CheckpointInfo | None:
    """The newest valid checkpoint's manifest and extras, agreed by every rank (collective)."""
    found = None
    if rank == 0:  # rank 0 reads the extras: other machines may not see its folder
        newest = store.latest_valid()
        if newest is not None:
            folder, manifest = newest
            found = (folder, manifest, dict(load_trainer(folder).get("extras", {})))
    agreed = _from_rank0(found)
    return None if agreed is None else CheckpointInfo(*agreed)


@dataclass(frozen=True)
class OtherRun:
    """Checkpoints in the store that this run did not write: another run's, or its own job's
    newest when that one was saved on preemption."""

    run_id: str
    newest_step: int
    count: int
    preempted: bool
    """The newest checkpoint was saved on a preemption signal: it is meant to be resumed."""


PREEMPTED_MARK = ".preempted.json"
"""A file in a local ``ckpt_dir`` naming the checkpoint a preempted run saved last."""


def other_run(store: CheckpointStore, identity: Identity, rank: int) -> OtherRun | None:
    """The checkpoints in ``store`` of another run (lineage), or of any run when the newest was
    saved on preemption (collective: rank 0 lists the manifests, every rank gets the answer)."""
    found = None
    if rank == 0:
        listed = store.candidates()
        marked = _preempted_mark(store)
        if listed and marked == listed[0][0].name and _same_command(store):
            newest = listed[0][1]
            found = (newest.lineage or newest.run_id or "(unnamed)", newest.step, 1, True)
        else:
            others = [
                manifest
                for _, manifest in listed
                if (manifest.lineage or manifest.run_id) != identity.lineage
            ]
            if others:
                newest = others[0]
                run_id = newest.lineage or newest.run_id or "(unnamed)"
                found = (run_id, newest.step, len(others), False)
    agreed = _from_rank0(found)
    return None if agreed is None else OtherRun(*agreed)


def _preempted_mark(store: CheckpointStore) -> str | None:
    found = store.read_mark(PREEMPTED_MARK).get("checkpoint")
    return found if isinstance(found, str) else None


def _same_command(store: CheckpointStore) -> bool:
    """Whether this process runs the command the preempted run ran (its script and arguments):
    only the same command resumes a preempted checkpoint by itself; another one (other script,
    other lr) is another run, refused as such (``previous_run``)."""
    command = store.read_mark(PREEMPTED_MARK).get("command")
    return command is None or _command() is None or command == _command()  # None: not known


def _command() -> list[str] | None:
    """This process's command line; None in a notebook's kernel (its arguments name a
    connection file that changes with every kernel start)."""
    return None if "ipykernel" in (sys.argv[0] if sys.argv else "") else list(sys.argv)


def mark_preempted(store: CheckpointStore, folder: Path | None) -> None:
    """Rank 0, after the save on a preemption signal: the next run in this folder resumes it
    (a store without marks, object storage, leaves that to ``--resume``)."""
    if folder is not None:
        mark = {"checkpoint": Path(folder).name, "time": time.time(), "command": _command()}
        store.write_mark(PREEMPTED_MARK, mark)


def clear_preempted(store: CheckpointStore) -> None:
    """Rank 0, after a resume: the preempted checkpoint has been taken up."""
    store.remove_mark(PREEMPTED_MARK)


def _adopting(pieces: Pieces) -> Callable[[Manifest], set[str]]:
    """The model files of a checkpoint to read into fresh tensors that the models take as they
    are (:meth:`ModuleLoader.adopt`): those of whole models on the CPU. The others are copied
    into their models from the page cache."""

    def files(manifest: Manifest) -> set[str]:
        if pieces.layout.partial or pieces.layout.sharded:
            return set()
        return {
            f"{stems(name)[0]}.safetensors"
            for name, unit in _units_by_saved_name(pieces, manifest).items()
            if adoptable(pieces.layout.unwrap(unit.module))
        }

    return files


def _units_by_saved_name(pieces: Pieces, manifest: Manifest) -> dict[str, Unit]:
    """The run's models by the name they have in the checkpoint (one model each: whatever
    the names)."""
    units = {u.name: u for u in pieces.tracked.units}
    saved = list(manifest.models)
    if len(saved) == 1 and len(units) == 1:
        units = {saved[0]: next(iter(units.values()))}
    return units


def _newest_intact(
    store: CheckpointStore,
    warn: Callable[[str], None],
    *,
    adopt: Callable[[Manifest], set[str]],
) -> Iterator[tuple[Staged, Manifest]]:
    """Checkpoints whose files read back intact on every rank, newest first, each read once.

    Each rank reads and checks the files itself (one pass: checksums while reading); the ranks
    then agree, and a checkpoint damaged for any of them is skipped by all, before any of its
    bytes reach a model or optimizer. (DCP shards are checked as they load; a damaged one makes
    the caller ask for the next checkpoint.)
    """
    listed = _from_rank0(store.candidates() if _rank() == 0 else [])
    for folder, manifest in listed:
        try:
            staged: Staged | None = store.read(folder, manifest, adopt(manifest))
            problem = ""
        except CheckpointDamagedError as err:  # an intact file that cannot be read: raised
            staged, problem = None, str(err)
        if _everywhere(staged is not None) and staged is not None:
            yield staged, manifest
        else:
            warn(f"skipping {folder}: {problem or 'damaged as read by another rank'}")


def _rank() -> int:
    return dist.get_rank() if distributed() else 0


def _everywhere(ok: bool) -> bool:
    """True when ``ok`` holds on every rank (collective)."""
    if not distributed():
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _from_rank0(value: T) -> T:
    """Rank 0's ``value``, for every rank (ranks must not resume from different folders)."""
    if not distributed():
        return value
    box: list[Any] = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[no-any-return]
