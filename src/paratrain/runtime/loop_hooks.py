"""What happens as the training loop moves, whatever the loop's shape.

    hooks = LoopHooks(LoopParts(config=..., console=..., ...))   # made by Run
    hooks.loop_action("backward")  # from epochs/progress/accumulate/backward/step/save: the loop
                                   # runs, so a restarted worker resumes now (once); after a
                                   # complete round, a preemption signal is acted on here
    hooks.last_micro_batch(key)  # is this micro-batch the last of the driving loader's pass?

Also the callbacks a :class:`paratrain.data.loader.DeviceLoader` makes (a pass starts, a batch
arrives).
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from paratrain.config import RunConfig
from paratrain.data.loader import DeviceLoader
from paratrain.distributed.watchdog import Watchdog
from paratrain.errors import ConfigError
from paratrain.profiling.step_profiler import StepProfiler
from paratrain.runtime.accumulation import Windows
from paratrain.runtime.checkpointer import Checkpointer
from paratrain.runtime.console import Console
from paratrain.runtime.loop_state import LoopState
from paratrain.runtime.preemption import PREEMPTED_EXIT, Preemption
from paratrain.runtime.registry import Registry
from paratrain.runtime.rng import capture_rng, restore_rng
from paratrain.runtime.seeding import seed_rank_stream
from paratrain.runtime.stats import StatsWriter
from paratrain.strategies import Strategy

_SAFE_ENTRIES = frozenset({"accumulate", "backward", "save", "epochs", "progress"})
"""Loop entries that may be a safe point (not ``step``: its gradients are not applied yet)."""
_REWOUND = frozenset({"accumulate", "backward"})
"""Entries where the next iteration has begun: random numbers drawn since the round's end (a
batch drawn just before ``with run.accumulate``) are drawn again by the rerun, so they are put
back; at ``backward`` the models' buffers too (the forward ran)."""


@dataclass(frozen=True)
class _Rewind:
    """The random generators and model buffers at a round's end, put back before a save taken
    at the next ``run.accumulate`` (random numbers only) or ``run.backward`` (the forward in
    between drew numbers and updated buffers)."""

    rng: dict[str, Any]
    buffers: list[tuple[torch.Tensor, torch.Tensor]]

    @staticmethod
    def capture(tracked: Registry) -> _Rewind:
        buffers = [(b, b.detach().clone()) for u in tracked.units for b in u.module.buffers()]
        return _Rewind(capture_rng(), buffers)

    def apply(self, *, buffers: bool) -> None:
        restore_rng(self.rng)
        if buffers:
            with torch.no_grad():
                for live, saved in self.buffers:
                    live.copy_(saved)


@dataclass(frozen=True, kw_only=True)
class LoopParts:
    """What the hooks work with, handed over by ``Run`` (nothing else of it is reached)."""

    config: RunConfig
    console: Console
    strategy: Strategy
    tracked: Registry
    loop: LoopState
    windows: Windows
    checkpoints: Checkpointer
    world_size: int
    data_rank: int
    data_size: int
    watchdog: Callable[[], Watchdog | None]
    """The hang watchdog, once started (None: not started, or off)."""
    profiler: Callable[[], StepProfiler | None]
    """The current profiling window (``run.profile`` replaces it)."""
    set_grad_accum: Callable[[int], None]
    """Change the micro-batches per step (``run.set_grad_accum``)."""
    preemption: Preemption | None
    """The preemption signals (``preempt_signals``; None: off)."""


class LoopHooks:
    """The run's reactions to the loop; also the hooks of its loaders."""

    _runs_made = 0

    def __init__(self, parts: LoopParts) -> None:
        self.run = parts
        self.rank_streams = False
        """True once each rank draws its own random numbers (after the first setup or a
        resume)."""
        self.batch_reported = False
        """True once the global batch was derived and printed (the first training loader)."""
        self._in_pass: dict[int, tuple[int, int]] = {}
        self._stream_group: Any = None
        self._settled = False
        """True once :meth:`loop_action` has nothing left to do but tell the watchdog."""
        self._alone: bool | None = None
        self._staging_prepared = False
        self._round_done = parts.preemption is not None
        """True from the end of a round (and the run's start) to the next safe point (with
        preemption signals only)."""
        self._rewind: _Rewind | None = None
        """What to put back before a save at ``run.backward`` (captured once a stop is due)."""
        parts.checkpoints.on_resume(self._resumed)
        LoopHooks._runs_made += 1
        self._run_number = LoopHooks._runs_made
        """Which Run of this process this is: every rank makes its Runs in the same order, so
        the number tells one Run's preemption key from the previous one's."""

    # -- data.LoaderHooks ------------------------------------------------------------------
    def current_epoch(self) -> int:
        """The run's epoch."""
        return self.run.loop.epoch

    def current_step(self) -> int:
        """The run's optimizer steps."""
        return self.run.loop.global_step

    def on_pass_start(self, loader: DeviceLoader[Any]) -> None:
        """Training: the loop runs (resume a restarted worker first). Evaluation: make buffers
        agree across ranks, so every rank evaluates the same model."""
        if loader.train:
            self.loop_action()
        else:
            for unit in self.run.tracked.units:
                self.run.strategy.sync_buffers(unit.module)
        self.progress()

    def on_batch(self) -> None:
        """A batch arrived."""
        self.progress()

    def safe_point(self) -> None:
        """Before a training batch is handed out: the first fetch after a complete round (no
        other batch of the iteration handed out yet, every optimizer of the round stepped) is
        where a preemption signal becomes a checkpoint and exit 75."""
        if self._round_done and self.run.preemption is not None:
            self._round_done = False
            self._stop_if_agreed(rewind=None)

    def _entry_safe_point(self, entry: str) -> None:
        """The first loop entry after a complete round when no training batch was fetched since
        (a loop whose batches no loader hands out): ``save``, ``epochs``/``progress``; or
        ``accumulate``/``backward``, where the next iteration has begun: the random numbers
        drawn since the round's end (and at ``backward`` the buffer updates of the forward,
        BatchNorm's) are put back as they were before the save, so that the rerun makes them
        again. (Random numbers drawn in post-step code are taken as the next iteration's.)"""
        if entry not in _SAFE_ENTRIES or not self._round_done:
            return
        if self._own_batches_mid_epoch():  # no safe point before the epoch's end
            self._stop_if_agreed(rewind=None, act=False)  # but note the step, learn the stop
            return
        self._round_done = False
        rewind, self._rewind = self._rewind, None
        if entry not in _REWOUND:  # save, epochs, progress: the state as it is now
            self._stop_if_agreed(rewind=None)
        elif rewind is not None or not self._is_alone():
            self._stop_if_agreed(rewind=rewind, buffers=entry == "backward")
        # alone, the signal came after the round's end: the next round's end captures it

    def _own_batches_mid_epoch(self) -> bool:
        """Inside a ``run.epochs`` epoch whose batches no training loader hands out (the loop
        makes its own), after a step: nothing says which of the epoch's batches were trained
        on, so a save here cannot resume exactly; the epoch's end (:meth:`epoch_ended`) can."""
        loop = self.run.loop
        if not loop.in_epochs or loop.global_step == loop.epoch_start_step:
            return False
        return not any(
            ld.train and ld.position.epoch == loop.epoch for ld in self.run.tracked.loaders
        )

    def epoch_ended(self) -> None:
        """``run.epochs`` moved to the next epoch: a safe point (the last one of a loop that
        makes its own batches inside ``run.epochs``)."""
        if self._round_done:
            self._entry_safe_point("epochs")

    def _is_alone(self) -> bool:
        alone = self._alone
        if alone is None:  # the group, when there is one, exists from the run's start
            alone = self._alone = self.run.world_size == 1 or not dist.is_initialized()
        return alone

    def _stop_if_agreed(
        self, rewind: _Rewind | None, *, act: bool = True, buffers: bool = False
    ) -> None:
        """Save and exit when the ranks agreed to stop at this step (``act=False``: only take
        part in the agreement, at a point that is no safe point)."""
        run = self.run
        preemption = run.preemption
        if preemption is None:
            return
        alone = self._is_alone()
        if preemption.quiet(alone=alone):
            return
        if run.windows.pending() or not run.tracked.units:
            return
        store = None if alone else dist.distributed_c10d._get_default_store()
        step = run.loop.global_step
        rank = 0 if alone else dist.get_rank()
        agreed = preemption.agreed(
            store, self._preempt_key(), step, rank=rank, world=run.world_size
        )
        if not (agreed and act):
            return
        if rewind is not None:
            rewind.apply(buffers=buffers)
        self._save_and_exit(step)

    def _preempt_key(self) -> str:
        attempt = self.run.checkpoints.parts.env.restart_count
        run_id = self.run.checkpoints.identity.run_id
        return f"paratrain/preempt/{run_id}/{attempt}/{self._run_number}"

    def _save_and_exit(self, step: int) -> None:
        run = self.run
        preemption = run.preemption
        assert preemption is not None
        grace = run.config.preempt_grace_s

        def abandon() -> None:
            run.checkpoints.mark_newest_preempted()  # the rerun resumes it, as promised
            run.console.warn(
                f"preempted at step {step}: the save did not finish within {grace:g} s of the "
                f"signal and was abandoned; the newest committed checkpoint stays valid. Exiting "
                f"with {PREEMPTED_EXIT}."
            )
            os._exit(PREEMPTED_EXIT)

        preemption.start_deadline(abandon)
        started = time.perf_counter()
        received = preemption.received
        folder = run.checkpoints.save_preempted(received[0].name if received else None)
        again = (
            "run the same command again to resume"
            if run.checkpoints.previous_run != "fresh"
            else "run the command again without --fresh (previous_run='fresh') to resume: with "
            "it, the run would set this checkpoint aside and start over"
        )
        run.console.print(
            f"paratrain: preempted at step {step}: saved {folder} in "
            f"{time.perf_counter() - started:.1f} s; exiting with {PREEMPTED_EXIT} ({again})"
        )
        raise SystemExit(PREEMPTED_EXIT)

    def warn(self, message: str) -> None:
        """A warning from the main process."""
        self.run.console.warn(message)

    def note(self, message: str) -> None:
        """A line of information from the main process."""
        self.run.console.print(message)

    def stream_group(self) -> Any:
        """A gloo group of all ranks on which streams agree to end a pass together (made once,
        when the first stream's loader is built on every rank; None in one process)."""
        if self._stream_group is None and dist.is_initialized() and dist.get_world_size() > 1:
            timeout = datetime.timedelta(seconds=self.run.config.timeout_s)
            self._stream_group = dist.new_group(backend="gloo", timeout=timeout)
        return self._stream_group

    def worker_signals(self) -> tuple[int, ...]:
        """The preemption signals (ignored by DataLoader workers; none when off)."""
        preemption = self.run.preemption
        return tuple(int(s) for s in preemption.signals) if preemption is not None else ()

    def progress(self) -> None:
        """Tell the hang watchdog the loop moved."""
        watchdog = self.run.watchdog()
        if watchdog is not None:
            watchdog.progress(self.run.loop.global_step)

    # -- the loop runs ----------------------------------------------------------------------
    def loop_action(self, entry: str = "", *, saving: bool = False) -> None:
        """Called by every training action: resume after a restart, once; refuse another
        run's checkpoints when this run did not resume (``previous_run``), once; start the
        profiler's step count (``Run(profile=...)``), once. Once all three are done, only the
        watchdog hears of it (this runs several times a step)."""
        if self._settled:
            if self._round_done:
                self._entry_safe_point("save" if saving else entry)
            self.progress()
            return
        checkpoints = self.run.checkpoints
        before = checkpoints.resumed_from
        checkpoints.resume_if_due(saving=saving)
        if entry in ("backward", "step") and checkpoints.resumed_from not in (None, before):
            raise ConfigError(
                f"this run resumed from {checkpoints.resumed_from} by itself at run.{entry}(), "
                "after the forward had run on the weights it had before: the loss is not the "
                "resumed model's, and training on would be silently wrong. Resume before the "
                "first forward: call run.resume() right after run.setup(...), or read "
                "run.global_step (`while run.global_step < N:`) or enter `with "
                "run.accumulate(model):` before the forward."
            )
        profiler = self.run.profiler()
        if profiler is not None and not profiler.running and not profiler.done:
            profiler.start(self.run.loop.global_step)
        self._settled = (
            bool(self.run.tracked.units)
            and not (checkpoints.auto_resume or checkpoints.previous_run_pending())
            and (profiler is None or profiler.running or profiler.done)
        )
        if self._round_done:
            self._entry_safe_point("save" if saving else entry)
        self.progress()

    def _resumed(self) -> None:
        """After a resume: generators come from the checkpoint (or stay as they are), and the
        loaders' positions are the checkpoint's, not the passes seen so far."""
        self.rank_streams = True
        self._in_pass.clear()

    def start_rank_streams(self) -> None:
        """After the first setup: each rank draws its own random numbers from now on."""
        run = self.run
        if not self.rank_streams:
            self.rank_streams = True
            seed_rank_stream(run.config.seed, run.data_rank)

    def first_loader(self, batch_size: int) -> None:
        """Derive grad_accum from ``global_batch`` and print the global batch, once."""
        run = self.run
        if self.batch_reported:
            return
        self.batch_reported = True
        world = run.data_size  # ranks of one tp group share a batch
        ranks = "world size" if world == run.world_size else "data-parallel ranks"
        if run.config.global_batch is not None:
            accum, rest = divmod(run.config.global_batch, batch_size * world)
            if rest or accum < 1:
                raise ConfigError(
                    f"global_batch={run.config.global_batch} is not a multiple of per-rank batch "
                    f"{batch_size} x {ranks} {world} = {batch_size * world}. Choose a "
                    "global batch that it divides, or another per-rank batch."
                )
            run.set_grad_accum(accum)
        run.checkpoints.settle_global_batch(batch_size)  # of a resume before this loader
        accum = run.loop.grad_accum
        run.console.print(
            f"paratrain: global batch {batch_size * world * accum} = per-rank batch "
            f"{batch_size} x {ranks} {world} x grad_accum {accum}"
        )

    def last_micro_batch(self, key: int) -> bool:
        """True when model ``key``'s micro-batch is the last of the driving loader's pass.

        The driver is the training loader whose running pass started first (the loop's own
        loader, not an auxiliary one read inside it). Micro-batches are counted per model from
        the start of that pass, so a wrapper that reads ahead ends the window neither early
        (the loader is done before the loop is) nor never (the pass ended a batch ago)."""
        pass_id, count = self._in_pass.get(key, (-1, 0))
        driver = ended = None
        for ld in self.run.tracked.loaders:
            if not ld.train:
                continue
            if ld.in_progress and (driver is None or ld.pass_id < driver.pass_id):
                driver = ld
            elif ended is None and ld.pass_id == pass_id:
                ended = ld
        if driver is None:  # a wrapper that reads ahead has finished the pass it still hands out
            if ended is None:
                return False
            driver = ended
        count = count + 1 if pass_id == driver.pass_id else 1
        self._in_pass[key] = (driver.pass_id, count)
        return driver.pass_length is not None and count >= driver.pass_length

    def stepped(
        self, *, new_round: bool, round_complete: Callable[[], bool], stats: StatsWriter | None
    ) -> None:
        """An optimizer stepped (``new_round``: the first of its round, the global step counts
        rounds; ``round_complete()``: every optimizer of the round has stepped, asked only with
        preemption signals): count it, move the profiler, write stats, open the next safe
        point."""
        run = self.run
        if new_round:
            if run.loop.stepped():
                self.warn_mid_epoch_save()
            if not self._staging_prepared:  # the optimizer state exists now
                self._staging_prepared = True
                run.checkpoints.prepare_async_save()
            profiler = run.profiler()
            if profiler is not None:
                profiler.step()
        if run.preemption is not None and round_complete():
            self._round_done = True
            if run.preemption.due(run.loop.global_step, self._is_alone()):
                self._rewind = _Rewind.capture(run.tracked)
        self.progress()
        if stats is not None and stats.due(run.loop.global_step):
            loaders = run.tracked.loaders
            stats.step(
                step=run.loop.global_step,
                samples=sum(ld.samples for ld in loaders),
                data_wait_s=sum(ld.data_wait_s for ld in loaders),
            )

    def warn_mid_epoch_save(self) -> None:
        """A step followed a save in the same epoch of a loop that makes its own batches."""
        epoch = self.run.loop.epoch
        self.run.console.warn(
            f"run.save() was called in the middle of epoch {epoch} of a `run.epochs` loop whose "
            "batches paratrain does not hand out (no run.loader pass in this epoch), so a "
            "resume from such a save cannot be exact: nothing says which of the epoch's batches "
            "were trained on. (This save was taken as the epoch's end; later ones in the middle "
            "of an epoch restart their epoch.) To resume exactly, save only at the end of an "
            "epoch, read the batches with run.loader, or count steps with run.global_step in a "
            "`while` loop instead of run.epochs."
        )

    def drop_unfinished_windows(self) -> None:
        """At the end of an epoch: forget windows that never reached a step, and say why."""
        run = self.run
        pending = run.windows.pending()
        if not pending:
            return
        count = run.windows.drop_pending()
        run.console.warn(
            f"epoch {run.loop.epoch} ended with {count} micro-batch(es) of an unfinished "
            "accumulation window; their gradients were dropped. The last micro-batch of an epoch "
            "is recognised when the loop runs the training loader's whole pass and the loader "
            "has a length; here the loop stopped early, iterated something shorter (zip), or "
            "the length was unknown (an IterableDataset)."
        )
        for unit in run.tracked.units:
            for optimizer in unit.optimizers:
                optimizer.zero_grad(set_to_none=True)
