"""What :meth:`Run.save` and :meth:`Run.resume` do with the run's state.

    run.save(extras={"best": 0.91})     # every rank calls it; rank 0 writes (FSDP: all write)
    extras = run.resume(model=model, optimizer=optimizer, scheduler=scheduler)

A save records where the loop is (epoch, step, samples of the epoch already consumed by all ranks
together), the scheduler, the fp16 scaler and every rank's random generators. A resume restores
them, so the continued run sees exactly the batches the uninterrupted one would have, also at a
different world size: the data position is re-split by global sample count, and generator states
that no longer map one-to-one onto ranks are re-derived from (seed, step, rank).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from paratrain.checkpoint.manifest import Manifest
from paratrain.checkpoint.rng import capture_rng, reseed_rng, restore_rng
from paratrain.checkpoint.store import CheckpointStore, SaveRequest
from paratrain.errors import CheckpointError, ConfigError
from paratrain.version import __version__

if TYPE_CHECKING:
    from paratrain.run import Run


def make_store(run: Run) -> CheckpointStore:
    """The run's checkpoint store (``ckpt_dir`` or ``run_dir/checkpoints``)."""
    directory = run.config.ckpt_dir or Path(run.config.run_dir) / "checkpoints"
    return CheckpointStore(
        Path(directory),
        keep_last=run.config.keep_last,
        check_timeout_s=run.config.timeout_s,
        warn=run.console.warn,
    )


def position(run: Run) -> tuple[int, int, int | None]:
    """(epoch, samples of that epoch consumed by all ranks, per-rank batch) right now."""
    loader = run.active_loader()
    if loader is None:
        return run.epoch, 0, None
    batch = loader.loader.batch_size or 1
    if loader.finished:
        return run.epoch + 1, 0, batch
    return run.epoch, loader.pass_start + loader.batches_yielded * batch * run.world_size, batch


def save(
    run: Run,
    *,
    model: nn.Module | None,
    optimizer: Optimizer | None,
    scheduler: Any,
    extras: dict[str, Any] | None,
) -> Path | None:
    """Write a checkpoint of the whole training state (collective)."""
    model = model or run.tracked_model
    if model is None:
        raise ConfigError(
            "run.save() found no model: call run.setup(model, ...) first, or pass model=... ."
        )
    if run.accumulation_window() > 0:
        raise ConfigError(
            "run.save() was called inside an accumulation window (gradients of "
            f"{run.accumulation_window()} micro-batch(es) not yet applied). Call it right after "
            "run.step(), when a step has been taken."
        )
    epoch, samples, batch = position(run)
    scaler = run.precision.scaler
    manifest = Manifest(
        paratrain_version=__version__,
        torch_version=torch.__version__,
        layout="sharded" if run.strategy.sharded_state else "replicated",
        strategy=run.strategy.name,
        world_size=run.world_size,
        per_rank_batch=batch,
        grad_accum=run.config.grad_accum,
        epoch=epoch,
        step=run.global_step,
        samples_in_epoch=samples,
        created=0.0,
    )
    trainer = {
        "position": {"epoch": epoch, "step": run.global_step, "samples_in_epoch": samples},
        "scheduler": (scheduler or run.tracked_scheduler).state_dict()
        if (scheduler or run.tracked_scheduler) is not None
        else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "extras": extras or {},
        "rng": capture_rng(),
        "seed": run.config.seed,
    }
    request = SaveRequest(
        target=run.unwrap(model),
        optimizer=optimizer or run.tracked_optimizer,
        trainer=trainer,
        manifest=manifest,
        sharded=run.strategy.sharded_state,
    )
    return run.store.save(request, background=run.config.async_save)


def resume(
    run: Run,
    *,
    model: nn.Module | None,
    optimizer: Optimizer | None,
    scheduler: Any,
    keep_global_batch: bool,
) -> dict[str, Any] | None:
    """Restore the newest valid checkpoint, if any; return its extras (None: nothing found)."""
    model = model or run.tracked_model
    optimizer = optimizer or run.tracked_optimizer
    if model is None:
        raise ConfigError("run.resume() needs the model: call run.setup first or pass model=.")
    found = _agree(run, run.store.latest_valid())
    if found is None:
        run.print(f"paratrain: no checkpoint in {run.store.directory}; starting fresh")
        return None
    folder, manifest = found
    trainer = run.store.load(
        folder, run.unwrap(model), optimizer, sharded=run.strategy.sharded_state
    )
    _restore_loop_state(run, trainer, scheduler)
    pos = trainer["position"]
    if manifest.world_size == run.world_size:
        restore_rng(trainer["rng"][run.rank])
    else:
        reseed_rng(seed=run.config.seed, step=pos["step"], rank=run.rank)
        run.print(
            f"paratrain: saved at world size {manifest.world_size}, resumed at "
            f"{run.world_size}: random generators re-derived from (seed, step, rank)"
        )
    _check_global_batch(run, manifest, keep_global_batch)
    run.resume_at(pos["epoch"], pos["samples_in_epoch"], pos["step"])
    run.print(
        f"paratrain: resumed from {folder} (epoch {pos['epoch']}, step {pos['step']}, "
        f"{pos['samples_in_epoch']} samples into the epoch)"
    )
    extras: dict[str, Any] = trainer.get("extras", {})
    return extras


def resume_after_restart(run: Run) -> None:
    """Resume a restarted worker and record the restart in ``run_dir/restarts.jsonl``."""
    found = run.resume()
    if run.is_main:
        record = {
            "time": time.time(),
            "restart": run.restart_count,
            "step": run.global_step,
            "epoch": run.epoch,
            "resumed": found is not None,
            "checkpoint_dir": str(run.store.directory),
        }
        path = Path(run.config.run_dir) / "restarts.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _agree(run: Run, found: tuple[Path, Manifest] | None) -> tuple[Path, Manifest] | None:
    """Rank 0's choice, for every rank (ranks must not resume from different folders)."""
    if not (dist.is_initialized() and run.world_size > 1):
        return found
    box: list[Any] = [found]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[no-any-return]


def _restore_loop_state(run: Run, trainer: dict[str, Any], scheduler: Any) -> None:
    scheduler = scheduler or run.tracked_scheduler
    if trainer.get("scheduler") is not None:
        if scheduler is None:
            run.console.warn(
                "the checkpoint has scheduler state but no scheduler was given to "
                "run.resume(scheduler=...); it was not restored"
            )
        else:
            scheduler.load_state_dict(trainer["scheduler"])
    scaler = run.precision.scaler
    if trainer.get("scaler") is not None and scaler is not None:
        scaler.load_state_dict(trainer["scaler"])


def _check_global_batch(run: Run, manifest: Manifest, keep: bool) -> None:
    loader = run.active_loader(any_pass=True)
    if manifest.global_batch is None or loader is None:
        return
    per_rank = loader.loader.batch_size or 1
    now = per_rank * run.world_size * run.config.grad_accum
    if now == manifest.global_batch:
        return
    if not keep:
        run.console.warn(
            f"global batch changed from {manifest.global_batch} (saved) to {now}; "
            "pass keep_global_batch=True to run.resume to keep it via grad_accum"
        )
        return
    accum, rest = divmod(manifest.global_batch, per_rank * run.world_size)
    if rest or accum < 1:
        raise CheckpointError(
            f"Cannot keep the global batch {manifest.global_batch}: per-rank batch {per_rank} x "
            f"world size {run.world_size} does not divide it. Choose a per-rank batch that does."
        )
    run.set_grad_accum(accum)
    run.print(
        f"paratrain: grad_accum set to {accum} to keep the global batch "
        f"{manifest.global_batch} at world size {run.world_size}"
    )
