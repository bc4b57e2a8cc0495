"""The one owner of a run's checkpoints: when to save and resume, and everything a resume sets.

    ckpts = Checkpointer(parts)                # made by Run
    ckpts.save(extras={"best": 0.9})           # collective
    ckpts.resume(keep_global_batch=False)      # run.resume(): restores, then sets grad_accum
    ckpts.resume_if_due()                      # at the loop's first action: after a restart, or
                                               # when the newest checkpoint was preempted

What a checkpoint holds and how it is written is :mod:`paratrain.runtime.save_restore` (the
format, given the registry's pieces); everything else about a resume is decided here, once: the
global batch rule (keep it by changing grad_accum, or report the change) is applied by
:meth:`Checkpointer.settle_global_batch`, at the resume when a training loader exists, else at the
first one. This module also refuses saves that would lose state, refuses another run's
checkpoints (``previous_run``), and records restarts in ``run_dir/restarts.jsonl``. Under
``paratrain verify-resume`` it starts the event trace and kill point
(:mod:`paratrain.core.faults`) and writes the final state at close or exit
(:mod:`paratrain.runtime.final_state`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from paratrain.checkpoint.remote_store import open_store
from paratrain.checkpoint.store import CheckpointStore
from paratrain.config import RunConfig
from paratrain.core import faults
from paratrain.core.run_dir import RunDir
from paratrain.distributed.environment import LaunchEnv, read_report
from paratrain.distributed.job_id import job_id
from paratrain.errors import CheckpointError, ConfigError
from paratrain.runtime import final_state
from paratrain.runtime import save_restore as checkpoints
from paratrain.runtime.accumulation import Windows
from paratrain.runtime.collector_pause import collector_paused
from paratrain.runtime.console import Console
from paratrain.runtime.loop_state import LoopState
from paratrain.runtime.precision import Precision
from paratrain.runtime.registry import Registry
from paratrain.strategies import Strategy


@dataclass(kw_only=True)
class RunParts:
    """The pieces of a Run that checkpoints read and restore."""

    config: RunConfig
    layout: RunDir
    env: LaunchEnv
    console: Console
    strategy: Strategy
    rank: int
    world_size: int
    tracked: Registry
    loop: LoopState
    precision: Precision
    windows: Windows
    set_grad_accum: Callable[[int], None]
    """Change the micro-batches per step (``run.set_grad_accum``)."""
    print_notes: Callable[[], None]
    """Print what the registry applied late (state that waited for its object)."""


class Checkpointer:
    """Saves and resumes of one run."""

    def __init__(self, parts: RunParts) -> None:
        self.parts = parts
        self.extras: dict[str, Any] = {}
        self.resumed_from: Path | None = None
        self.identity = checkpoints.Identity(run_id=_run_id(parts), lineage="")
        self.identity.lineage = self.identity.run_id
        self.previous_run = parts.env.previous_run or parts.config.previous_run
        """``previous_run``: the launcher's ``--resume``/``--fresh``, else the setting."""
        self.auto_resume = parts.env.restart_count > 0 or self.previous_run == "resume"
        self._resume_asked = False
        """Whether a resume ran (asked by the script or after a restart): the run continues
        whatever the folder holds, so :meth:`check_previous_run` has nothing to refuse."""
        self._global_batch: tuple[int | None, bool] | None = None
        """(saved global batch, keep it) of a resume, until :meth:`settle_global_batch`."""
        self._on_resume: list[Callable[[], None]] = []
        self._restart_recorded = False
        self._store: CheckpointStore | None = None
        self.last_extras: dict[str, Any] = {}
        """The extras of the last checkpoint saved or resumed."""
        self._recorder = faults.start(
            trace_dir=parts.env.trace,
            kill=parts.env.kill,
            rank=parts.rank,
            restart=parts.env.restart_count,
            where=lambda: (parts.loop.global_step, parts.loop.epoch),
        )
        self._final = self._final_state()
        self.store.check_writable()  # object storage: bucket, credentials, endpoint, now

    @property
    def location(self) -> str | Path:
        """``ckpt_dir`` (a folder or a URL), default ``run_dir/checkpoints``."""
        return self.parts.layout.checkpoints_at(self.parts.config.ckpt_dir)

    @property
    def store(self) -> CheckpointStore:
        """The checkpoint store (made on first use)."""
        if self._store is None:
            config = self.parts.config
            self._store = open_store(
                self.location,
                staging=self.parts.layout.ckpt_staging,
                storage_options=config.ckpt_storage_options,
                keep_last=config.keep_last,
                # Below the watchdog's 0.9 x timeout_s: a save called on some ranks only ends
                # with the error that says so, not with a stall report.
                check_timeout_s=0.8 * config.timeout_s,
                warn=self.parts.console.warn,
                say=self.parts.console.print,
            )
        return self._store

    def _pieces(self) -> checkpoints.Pieces:
        p = self.parts
        layout = checkpoints.Layout(
            strategy=p.strategy.name,
            world_size=p.world_size,
            rank=p.rank,
            sharded=p.strategy.sharded_state,
            mesh=p.strategy.recorded_mesh(),
            data_rank=p.strategy.data_rank,
            data_size=p.strategy.data_size,
            seed=p.config.seed,
            unwrap=p.strategy.unwrap,
            partial=p.strategy.partial_model,
        )
        return checkpoints.Pieces(
            tracked=p.tracked, loop=p.loop, precision=p.precision, layout=layout
        )

    def save(self, extras: dict[str, Any] | None) -> Path | None:
        """Checkpoint everything registered (collective); refuse what would lose state."""
        p = self.parts
        pending = p.windows.pending()
        if pending:
            raise ConfigError(
                "run.save() was called inside an accumulation window (gradients of "
                f"{max(w.count for w in pending)} micro-batch(es) not yet applied). Call it "
                "right after run.step(), when a step has been taken."
            )
        if p.tracked.pending:
            p.console.warn(
                f"the resumed checkpoint holds {sorted(p.tracked.pending)}, which this run "
                "never registered; this save does not contain them. Register them (run.setup("
                "..., name=), run.track(obj, name=), run.loader) before saving to keep them."
            )
        for unit in p.tracked.units:
            p.strategy.sync_buffers(unit.module)
        with collector_paused():
            folder = checkpoints.save(
                self._pieces(), self.store, self.identity, extras, background=p.config.async_save
            )
        self.last_extras = dict(extras or {})
        faults.emit("saved")
        return folder

    def on_resume(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every resume (the loop hooks forget loader passes)."""
        self._on_resume.append(listener)

    def resume(self, *, keep_global_batch: bool) -> dict[str, Any] | None:
        """Restore the newest valid checkpoint into every registered piece and set what follows
        from it (grad_accum, the global batch rule, this run's lineage); return its extras, or
        None when there is nothing to resume (collective)."""
        p = self.parts
        restarted = p.env.restart_count > 0
        if self.previous_run == "fresh" and not restarted and not self._resume_asked:
            # `paratrain run --fresh` wins over the script's run.resume(): another run's
            # checkpoints are moved aside first (this job's own restarts resume as usual)
            self.check_previous_run()
        self.auto_resume = False
        self._resume_asked = True
        if p.rank == 0:
            checkpoints.clear_preempted(self.store)
        with collector_paused():
            resumed = checkpoints.resume(
                self._pieces(), self.store, self.identity, say=p.console.print, warn=p.console.warn
            )
        if resumed is not None:
            self.extras, self.resumed_from = resumed.extras, resumed.folder
            self.last_extras = resumed.extras
            self._global_batch = (resumed.manifest.global_batch, keep_global_batch)
            loaders = [ld for ld in p.tracked.loaders if ld.train]
            if loaders:  # else at the first training loader
                self.settle_global_batch(loaders[0].loader.batch_size or 1)
        if restarted and not self._restart_recorded:
            self._restart_recorded = True
            self._record_restart(resumed)
        for listener in self._on_resume:
            listener()
        p.print_notes()
        return None if resumed is None else resumed.extras

    def resume_if_due(self, *, saving: bool = False) -> None:
        """As soon as a model is set up, whatever the loop's shape (collective, once): after a
        torchrun restart, resume from the newest valid checkpoint; in a run that did not
        resume, refuse another run's checkpoints (``previous_run``), or resume the newest when
        it was saved on preemption. The global batch is kept: an elastic job restarted on fewer
        (or more) nodes changes grad_accum instead."""
        if not self.parts.tracked.units:
            return
        if self.auto_resume:
            self.resume(keep_global_batch=True)
        if self.previous_run_pending():
            if saving:  # a save on some ranks only: its own error, not a hang in the check
                self.store.check_every_rank_called()
            if self.check_previous_run():  # the newest was saved on preemption
                try:
                    self.resume(keep_global_batch=True)
                except CheckpointError as err:
                    raise CheckpointError(
                        f"{err} (It was resumed by itself because it was saved when a run in "
                        "this ckpt_dir was preempted. If this is another run, start it with "
                        "`paratrain run --fresh` (Run(previous_run='fresh')), which moves the "
                        "old checkpoints aside.)"
                    ) from None

    def settle_global_batch(self, per_rank: int) -> None:
        """The global batch rule of the last resume, applied once the per-rank batch is known:
        when the data-parallel size changed the global batch, ``keep_global_batch`` changes
        grad_accum to keep the saved one; otherwise the change is reported."""
        if self._global_batch is None:
            return
        saved, keep = self._global_batch
        self._global_batch = None
        p = self.parts
        world, accum = p.strategy.data_size, p.loop.grad_accum
        now = per_rank * world * accum
        if saved is None or now == saved:
            return
        if not keep:
            p.console.warn(
                f"global batch changed from {saved} (saved) to {now}; "
                "pass keep_global_batch=True to run.resume to keep it via grad_accum"
            )
            return
        new, rest = divmod(saved, per_rank * world)
        if rest or new < 1:
            raise CheckpointError(
                f"Cannot keep the global batch {saved}: per-rank batch {per_rank} x world size "
                f"{world} does not divide it. Choose a per-rank batch that does."
            )
        p.console.print(
            f"paratrain: grad_accum set to {new} to keep the global batch {saved} at world size "
            f"{world}"
        )
        p.set_grad_accum(new)

    def prepare_async_save(self) -> None:
        """With ``async_save``, on the main process: have the store allocate the host buffers
        of the first save in the background (called after the first optimizer step, when the
        optimizer state exists), so that save stalls no longer than later ones."""
        p = self.parts
        if not p.config.async_save or p.rank != 0:
            return
        tensors: list[torch.Tensor] = []
        for unit in p.tracked.units:
            tensors += unit.module.state_dict().values()
            for optimizer in unit.optimizers:
                for state in optimizer.state.values():
                    tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
        self.store.prepare_staging(tensors)

    def save_preempted(self, signal_name: str | None) -> Path | None:
        """The checkpoint of a preempted run: any save in flight drained, then one written
        synchronously (collective); the launcher is told (``PARATRAIN_REPORT``)."""
        p = self.parts
        self.store.wait()
        with collector_paused():
            folder = checkpoints.save(
                self._pieces(), self.store, self.identity, self.last_extras, background=False
            )
        faults.emit("saved")
        if p.rank == 0:
            checkpoints.mark_preempted(self.store, folder)
        if p.rank == 0 and p.env.report is not None:
            record = dict(read_report(Path(p.env.report)) or {})
            record["preempted"] = {
                "step": p.loop.global_step,
                "checkpoint": str(folder),
                "signal": signal_name,
            }
            p.env.write_report(record)
        return folder

    def mark_newest_preempted(self) -> None:
        """Rank 0, when the save on preemption is abandoned: the newest committed checkpoint is
        the one the rerun resumes (without the mark, a script that does not call run.resume()
        would have it refused as another run's)."""
        if self.parts.rank != 0:
            return
        try:
            newest = self.store.latest_valid()
            if newest is not None:
                checkpoints.mark_preempted(self.store, newest[0])
        except Exception as err:  # the process is exiting: say it, do not hide the exit
            self.parts.console.warn(f"could not mark the newest checkpoint for the rerun: {err}")

    def preempted_unsaved(self) -> None:
        """At close: a preemption signal came, but no safe point followed (the training loop had
        ended). Say so, correcting the promise the signal handler printed."""
        self.parts.console.print(
            "paratrain: the preemption signal came after the training loop's last safe point: "
            "the loop has ended, so no checkpoint is saved for it and the script finishes "
            "normally"
        )

    def previous_run_pending(self) -> bool:
        """Whether :meth:`check_previous_run` has still to look (this run has not resumed)."""
        return not (self._resume_asked or self.auto_resume)

    def check_previous_run(self) -> bool:
        """At the first training action of a run that did not resume: True when the newest
        checkpoint was saved on preemption (the caller resumes it); another run's checkpoints
        in ``ckpt_dir`` are refused (``previous_run='refuse'``) or moved aside (``'fresh'``),
        never mixed with this run's (collective, once)."""
        if self._resume_asked or self.auto_resume:
            return False
        self._resume_asked = True  # checked once
        other = checkpoints.other_run(self.store, self.identity, self.parts.rank)
        if other is None or (self.previous_run == "share" and not other.preempted):
            return False
        if other.preempted and self.previous_run != "fresh":
            self.parts.console.print(
                f"paratrain: the newest checkpoint (step {other.newest_step}) was saved when run "
                f"{other.run_id} was preempted: resuming it"
            )
            return True
        aside = f"{self.store.location}.{other.run_id}"
        if self.previous_run == "fresh":
            self._set_aside(Path(aside), other)
            return False
        raise ConfigError(
            f"ckpt_dir {self.store.location} holds {other.count} checkpoint(s) of run "
            f"{other.run_id} (newest at step {other.newest_step}), and this run "
            f"({self.identity.run_id}) did not resume from them: training on would mix two "
            "runs' checkpoints, and a later resume could pick either. To continue run "
            f"{other.run_id}, call run.resume() before training, or launch with `paratrain run "
            "--resume` (Run(previous_run='resume')). To start over, launch with `paratrain run "
            f"--fresh` (Run(previous_run='fresh')), which moves them to {aside}; or give this "
            "run another run_dir or ckpt_dir (Run(previous_run='share') writes beside them "
            "on purpose)."
        )

    def _set_aside(self, aside: Path, other: checkpoints.OtherRun) -> None:
        """Rank 0 moves the folder aside (the store refuses where it cannot); every rank gets
        the outcome, and none saves into the folder before it has moved."""
        p = self.parts
        problem: list[str | None] = [None]
        if p.rank == 0:
            try:
                target = self.store.move_aside(aside.name)
            except ConfigError as err:
                problem[0] = str(err)
            else:
                p.console.print(
                    f"paratrain: previous_run='fresh': the {other.count} checkpoint(s) of run "
                    f"{other.run_id} were moved to {target}; starting at step 0"
                )
        if p.world_size > 1 and dist.is_initialized():
            dist.broadcast_object_list(problem, src=0)
        if problem[0] is not None:
            raise ConfigError(problem[0])

    def latest(self) -> checkpoints.CheckpointInfo | None:
        """The newest valid checkpoint's manifest and extras (collective)."""
        return checkpoints.latest(self.store, self.parts.rank)

    def _record_restart(self, resumed: checkpoints.Resumed | None) -> None:
        """One line of ``restarts.jsonl``: the attempt, where it resumed, and the world size
        before and after (they differ when an elastic job lost or gained a node)."""
        p = self.parts
        if p.rank != 0:
            return
        record = {
            "time": time.time(),
            "restart": p.env.restart_count,
            "step": p.loop.global_step,
            "epoch": p.loop.epoch,
            "resumed": resumed is not None,
            "checkpoint_dir": self.store.location,
            "world_size": p.world_size,
            "saved_world_size": resumed.manifest.trained_at[0] if resumed is not None else None,
            "grad_accum": p.loop.grad_accum,
        }
        p.layout.restarts.parent.mkdir(parents=True, exist_ok=True)
        with p.layout.restarts.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def _final_state(self) -> final_state.FinalState | None:
        """``PARATRAIN_FINAL_STATE``: this rank's state, written at close or at exit."""
        p = self.parts
        if p.env.final_state is None:
            return None
        pieces = final_state.Pieces(
            tracked=p.tracked,
            loop=p.loop,
            precision=p.precision,
            unwrap=p.strategy.unwrap,
            extras=lambda: self.last_extras,
            rank=p.rank,
            restart=p.env.restart_count,
            world_size=p.world_size,
        )
        final = final_state.FinalState(Path(p.env.final_state), pieces)
        final.start()
        return final

    def close(self) -> None:
        """Wait for an asynchronous save in flight; write the final state if asked for."""
        try:
            if self._store is not None:
                self._store.wait()
        finally:
            if self._final is not None:
                self._final.write()
            faults.stop(self._recorder)


def _run_id(parts: RunParts) -> str:
    """The job's id (:func:`paratrain.distributed.job_id.job_id`), decided by rank 0."""
    ids: list[Any] = [job_id(parts.env, parts.layout.job) if parts.rank == 0 else None]
    if parts.world_size > 1 and dist.is_initialized():
        dist.broadcast_object_list(ids, src=0)
    return str(ids[0])
