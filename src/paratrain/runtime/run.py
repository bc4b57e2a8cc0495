"""``Run``: one object that owns the process group, the strategy, precision and the loop state.

    import paratrain as pt

    with pt.Run(strategy="auto", precision="bf16", grad_accum=4, max_grad_norm=1.0) as run:
        model, optimizer = run.setup(model, optimizer, scheduler=scheduler)
        loader = run.loader(train_set, batch_size=32, shuffle=True)      # per-rank batch
        run.resume()                                     # newest valid checkpoint, if any
        for epoch in run.epochs(10):
            for x, y in run.progress(loader):                           # already on run.device
                with run.accumulate(model):
                    loss = criterion(model(x), y)
                    run.backward(loss)
                run.step(optimizer, scheduler)          # steps only at the end of a window
            run.save()                                  # everything registered, every time

What a checkpoint holds is registered once: models and optimizers by ``run.setup``, schedulers by
``run.setup(scheduler=)``, ``run.step`` or ``run.resume``, training loaders by ``run.loader``, the
rest by ``run.track``. Own ``while`` loops count with ``run.global_step``. The same script runs
in one process, under ``torchrun``/``paratrain run`` or Slurm; after a torchrun restart the run
resumes by itself at the first training action (an epoch, a loader pass, a step, a save, ...).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import Dataset

from paratrain.checkpoint.store import CheckpointStore
from paratrain.config import RunConfig
from paratrain.core import faults
from paratrain.data import loader as data
from paratrain.data.build import make_loader
from paratrain.errors import ConfigError
from paratrain.profiling.step_profiler import Profile, StepProfiler, as_profile, check_no_window
from paratrain.runtime import oom
from paratrain.runtime.accumulation import Windows
from paratrain.runtime.checkpointer import Checkpointer, RunParts
from paratrain.runtime.loop_hooks import LoopHooks, LoopParts
from paratrain.runtime.loop_state import LoopState
from paratrain.runtime.model_setup import (
    attach_loss,
    check_disjoint,
    check_loss_fn,
    prepare_model,
    rebind_optimizer,
)
from paratrain.runtime.preemption import Preemption
from paratrain.runtime.registry import Registry, Unit
from paratrain.runtime.run_base import RunBase
from paratrain.runtime.save_restore import CheckpointInfo
from paratrain.runtime.seeding import rank_seed, seed_everything
from paratrain.runtime.stats import StatsWriter
from paratrain.runtime.stepping import StepPath, Stepper, refuse_metric_scheduler
from paratrain.trackers import STATE_NAME as TRACKER_STATE

T = TypeVar("T")


class Run(RunBase):
    """A training run on this process's share of the job.

    Pass either a ``RunConfig`` or its fields as keyword settings (``strategy``, ``precision``,
    ``grad_accum``, ...; every one is in the settings reference), not both:

        with pt.Run(strategy="ddp", precision="bf16", grad_accum=4) as run:
            model, optimizer = run.setup(model, optimizer)
            loader = run.loader(train_set, batch_size=32)              # per-rank batch
            run.resume()                                   # newest valid checkpoint, if any
            for epoch in run.epochs(10):
                for x, y in loader:                                  # already on run.device
                    with run.accumulate(model):
                        run.backward(criterion(model(x), y))
                    run.step(optimizer)                  # steps at the end of a window
                run.save()

    Attributes: ``config``, ``topology``, ``strategy``, ``device``, ``rank``, ``local_rank``,
    ``world_size``, ``is_main``, ``epoch``, ``global_step``, ``run_dir``, ``restart_count``,
    ``rank_seed``, ``extras``, ``resumed_from``, ``last_grad_norm``, ``store``, ``console``.
    """

    def __init__(self, config: RunConfig | None = None, /, **settings: Any) -> None:
        super().__init__(config, **settings)
        try:
            self._start_training()
        except BaseException:
            self.close()
            raise

    def _start_training(self) -> None:
        """Loop state, registry, checkpoints: everything after the process group."""
        seed_everything(self.config.seed)
        # An out-of-memory report of an earlier run in this run dir is not this run's.
        (self.layout.oom / f"rank{self.rank}.txt").unlink(missing_ok=True)
        self.loop = LoopState(grad_accum=self.config.grad_accum)
        """Epoch, step and grad_accum (saved by every checkpoint)."""
        self.tracked = Registry()
        """Everything a checkpoint holds (models, optimizers, schedulers, loaders, objects)."""
        # The tracker runs' ids (rank 0 opens them): rank 0's serves every rank.
        self.tracked.add_object(self.console.trackers, TRACKER_STATE, replicated=True)
        self._stepper = Stepper(self.precision, self.strategy, self.config.max_grad_norm)
        self._windows = Windows(self.config.grad_accum)
        self._checkpoints = Checkpointer(
            RunParts(
                config=self.config,
                layout=self.layout,
                env=self._env,
                console=self.console,
                strategy=self.strategy,
                rank=self.rank,
                world_size=self.world_size,
                tracked=self.tracked,
                loop=self.loop,
                precision=self.precision,
                windows=self._windows,
                set_grad_accum=self.set_grad_accum,
                print_notes=self._print_notes,
            )
        )
        self.console.trackers.set_job(
            self._checkpoints.identity.run_id, restarted=self.restart_count > 0
        )
        self._profiler = self._new_profiler(as_profile(self.config.profile))
        self._preemption = (
            Preemption(
                self.config.preempt_signals,
                grace_s=self.config.preempt_grace_s,
                warn=self.console.warn,
                first=self._watchdog.end_if_hang_named if self._watchdog is not None else None,
            )
            if self.config.preempt_signals
            else None
        )
        if self._preemption is not None:
            self._preemption.install()
        self._hooks = LoopHooks(
            LoopParts(
                config=self.config,
                console=self.console,
                strategy=self.strategy,
                tracked=self.tracked,
                loop=self.loop,
                windows=self._windows,
                checkpoints=self._checkpoints,
                world_size=self.world_size,
                data_rank=self.data_rank,
                data_size=self.data_size,
                watchdog=lambda: self._watchdog,
                profiler=lambda: self._profiler,
                set_grad_accum=self.set_grad_accum,
                preemption=self._preemption,
            )
        )
        if self.config.per_rank_batch is not None:
            self._hooks.first_loader(self.config.per_rank_batch)
        self._stats = (
            StatsWriter(
                self.layout.stats, rank=self.rank, every=self.config.stats_every, device=self.device
            )
            if self.config.stats_every
            else None
        )
        self._step_path = StepPath(
            self._windows,
            self._stepper,
            self.loop,
            stepped=lambda new_round, complete: self._hooks.stepped(
                new_round=new_round, round_complete=complete, stats=self._stats
            ),
        )
        self.console.print(
            f"paratrain: strategy {self.strategy.name} ({self.selection.reason}), "
            f"world size {self.world_size}, device {self.device.type}, "
            f"backend {self.selection.backend if self.strategy.multi_process else '-'}, "
            f"precision {self.config.precision}"
        )
        for note in self.selection.notes:
            self.console.warn(note)

    @property
    def last_grad_norm(self) -> float | None:
        """Gradient norm before clipping at the last step (when ``max_grad_norm`` is set)."""
        return self._stepper.last_grad_norm

    @property
    def extras(self) -> dict[str, Any]:
        """The extras of the checkpoint this run resumed from (``{}`` for a fresh run), however
        the resume happened (``run.resume()`` or on its own after a restart)."""
        self._checkpoints.resume_if_due()
        return self._checkpoints.extras

    @property
    def resumed_from(self) -> Path | None:
        """The checkpoint folder this run resumed from, or None."""
        return self._checkpoints.resumed_from

    @property
    def rank_seed(self) -> int:
        """This rank's seed: ``seed`` on rank 0, a distinct value derived from it elsewhere.

        From the first ``run.setup`` on, python/numpy/torch generators follow it, so dropout,
        augmentation and ``torch.randint`` batch sampling differ across ranks. Seed your own
        generators with it: ``torch.Generator().manual_seed(run.rank_seed)``."""
        return rank_seed(self.config.seed, self.data_rank)  # one stream per tp group

    @property
    def epoch(self) -> int:
        """Current epoch (0-based), advanced by :meth:`epochs`; restored by a resume."""
        self._checkpoints.resume_if_due()
        return self.loop.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.loop.epoch = value

    @property
    def global_step(self) -> int:
        """Optimizer steps so far (several optimizers stepping in one round count once)."""
        self._checkpoints.resume_if_due()
        return self.loop.global_step

    @global_step.setter
    def global_step(self, value: int) -> None:
        self.loop.global_step = value

    # -- registration: models, optimizers, schedulers, anything with state ----------------------
    def setup(
        self,
        model: nn.Module,
        *optimizers: Optimizer,
        scheduler: Any = None,
        name: str | None = None,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    ) -> Any:
        """Place and wrap ``model`` for the strategy; rebind its ``optimizers``; register all.

        Returns the model, or ``(model, optimizer, ...)`` when optimizers are given. ``name``
        keys the model in checkpoints (default ``model``, ``model_1``, ... in setup order).
        ``loss_fn(output, target)`` makes ``model(x, target=y)`` return the loss under every
        strategy; ``pipeline`` needs it (it computes the loss inside its schedule)."""
        names = {id(p): n for n, p in model.named_parameters()}
        check_disjoint(optimizers, names)
        check_loss_fn(loss_fn)
        wrapped = prepare_model(
            model, self.strategy, self.precision, self.config.activation_checkpointing
        )
        for note in self.strategy.notes:
            self.console.print(note)
        self.strategy.notes.clear()
        attach_loss(wrapped, loss_fn, lambda: self.loop.grad_accum, self.strategy)
        params = dict(self.strategy.unwrap(wrapped).named_parameters())
        for optimizer in optimizers:
            rebind_optimizer(optimizer, names, params, partial=self.strategy.partial_model)
            self.precision.optimizers.add(id(optimizer))
        self.tracked.add_unit(wrapped, list(optimizers), name)
        if scheduler is not None:
            self.tracked.add_scheduler(scheduler)
        self._hooks.start_rank_streams()
        self._print_notes()
        if self._plan is not None:
            self._plan.watch(self.strategy.unwrap(wrapped), list(optimizers))
        return (wrapped, *optimizers) if optimizers else wrapped

    def track(self, obj: T, name: str | None = None, *, replicated: bool = False) -> T:
        """Save and restore ``obj`` (anything with ``state_dict``/``load_state_dict``: an EMA
        model, a metric, an RNN's hidden state) with every checkpoint, per rank; returns it.
        ``replicated=True``: rank 0's state serves every rank (see "What a checkpoint holds" in
        docs/concepts/exact-resume.md)."""
        self.tracked.add_object(obj, name, replicated=replicated)
        self._print_notes()
        return obj

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside the strategy's wrapper (``model.module`` for DDP)."""
        return self.strategy.unwrap(model)

    # -- data -----------------------------------------------------------------------------
    def loader(
        self,
        dataset: Dataset[Any],
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        **dataloader_kwargs: Any,
    ) -> data.DeviceLoader[Any]:
        """A training loader: ``batch_size`` samples per rank, sharded and reshuffled each epoch.

        Its position is saved by every checkpoint and restored by a resume."""
        declared = self.config.per_rank_batch
        if declared is not None and batch_size != declared:
            raise ConfigError(
                f"run.loader(batch_size={batch_size}) but per_rank_batch={declared} was set: "
                "grad_accum was derived from it. Use the same per-rank batch in both places."
            )
        loader = self._build(dataset, batch_size, True, shuffle, drop_last, dataloader_kwargs)
        self.strategy.check_batch(batch_size, loader.last_batch_size())
        self._hooks.first_loader(batch_size)
        self.tracked.add_loader(loader)
        self._print_notes()
        return loader

    def eval_loader(
        self, dataset: Dataset[Any], batch_size: int, *, drop_last: bool = False, **kwargs: Any
    ) -> data.DeviceLoader[Any]:
        """An evaluation loader: every sample is seen by exactly one rank, once, and every rank
        runs the same number of batches (so no rank waits alone in a forward's collective)."""
        if drop_last is not False:
            raise ConfigError(
                "run.eval_loader(drop_last=True): an exact-once evaluation loader never drops "
                "samples. Drop the argument; use run.loader for a training-style loader."
            )
        return self._build(dataset, batch_size, False, False, False, kwargs)

    def _build(
        self,
        dataset: Dataset[Any],
        batch_size: int,
        train: bool,
        shuffle: bool,
        drop_last: bool,
        kwargs: dict[str, Any],
    ) -> data.DeviceLoader[Any]:
        return make_loader(
            dataset,
            batch_size,
            train=train,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=self.config.seed,
            topology=self.topology,
            data_rank=self.data_rank,
            data_size=self.data_size,
            device=self.device,
            num_workers=kwargs.pop("num_workers", self.config.num_workers),
            hooks=self._hooks,
            name="loader" if train else "eval_loader",
            kwargs=kwargs,
        )

    # -- the loop -------------------------------------------------------------------------
    def epochs(self, count: int) -> Iterator[int]:
        """Yield epoch numbers from the current one up to ``count - 1``; samplers follow them."""
        self._hooks.loop_action("epochs")
        self.loop.in_epochs = True
        try:
            while self.loop.epoch < count:
                yield self.loop.epoch
                self._hooks.drop_unfinished_windows()
                self.loop.next_epoch()
                self._hooks.epoch_ended()
                faults.emit("epoch")
        finally:
            self.loop.in_epochs = False

    def progress(self, iterable: Iterable[T], *, desc: str | None = None) -> Iterator[T]:
        """A progress bar on the main process; the bare iterable on the other ranks."""
        self._hooks.loop_action("progress")
        return self.console.progress(iterable, desc=desc or f"epoch {self.loop.epoch}")

    def accumulate(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Run one micro-batch of ``model``; its gradients sync only on a window's last one.

        with run.accumulate(model):
            run.backward(model(x, target=y))
        """
        self._hooks.loop_action("accumulate")
        return _MicroBatch(self, self._set_up(model).module)

    def backward(self, loss: torch.Tensor, **backward_kwargs: Any) -> None:
        """``loss.backward(**backward_kwargs)`` with the loss divided by ``grad_accum`` and
        scaled for fp16 (``retain_graph=``, ``inputs=``, ``create_graph=`` pass through)."""
        self._hooks.loop_action("backward")
        strategy = self.strategy
        if strategy.partial_model:
            if getattr(loss, "_paratrain_pipeline", False):
                return  # the pipeline's schedule ran this backward, micro-batch by micro-batch
            raise ConfigError(
                "run.backward got a tensor that is not the loss the pipeline returned (a loss "
                "scaled, summed with another term, or computed outside model(x, target=y)). The "
                "schedule back-propagates each micro-batch's loss_fn inside the pipeline, so "
                "nothing else can be added afterwards: put the weighting or the extra term into "
                "loss_fn, and pass run.backward the loss model(x, target=y) returned."
            )
        self._stepper.generation += 1  # new gradients: siblings prepare them again
        if self.loop.grad_accum > 1:
            loss = loss / self.loop.grad_accum
        loss = self.precision.scale(loss)
        if strategy.loss_parallel:  # split logits: the loss's backward is a DTensor op too
            with strategy.loss_context():
                loss.backward(**backward_kwargs)  # type: ignore[no-untyped-call]
        else:
            loss.backward(**backward_kwargs)  # type: ignore[no-untyped-call]

    def step(self, optimizer: Optimizer, scheduler: Any = None) -> bool:
        """At the end of ``optimizer``'s window: unscale, clip, step, zero_grad, step the
        ``scheduler`` (registered for checkpoints). Returns True if the optimizer stepped."""
        if scheduler is not None:
            refuse_metric_scheduler(scheduler)
        self._hooks.loop_action("step")
        unit = self.tracked.unit_of(optimizer) or self._attach(optimizer)
        if scheduler is not None:
            self.tracked.add_scheduler(scheduler)
            self._print_notes()
        if self._plan is None:
            return self._step_path.step(optimizer, unit, scheduler)
        self._plan.before_step()
        stepped = self._step_path.step(optimizer, unit, scheduler)
        if stepped:
            self._plan.stepped()  # raises PlanComplete: `paratrain plan` has its step
        return stepped

    def profile(self, *, wait: int = 0, warmup: int = 1, active: int = 3, **record: bool) -> None:
        """Profile steps from the next one on (after ``wait`` + ``warmup``, ``active`` steps):
        a trace per rank in ``run_dir/profile`` and a printed table of where the time went.
        ``record`` takes :class:`paratrain.Profile`'s ``record_shapes``, ``profile_memory``,
        ``with_stack``. Call it on every rank; see :mod:`paratrain.profiling.step_profiler`."""
        window = as_profile(dict(wait=wait, warmup=warmup, active=active, **record), "run.profile")
        check_no_window(self._profiler, closed=self._closed)
        self.barrier("run.profile")  # every rank arms it: the window's end is collective
        self._profiler = profiler = self._new_profiler(window)
        assert profiler is not None  # a dict of fields always asks for a window
        profiler.start(self.loop.global_step)

    def _new_profiler(self, window: Profile | None) -> StepProfiler | None:
        if window is None:
            return None
        layout, rank, device, console = self.layout, self.rank, self.device, self.console
        return StepProfiler(
            window, directory=layout.profile, rank=rank, device=device, console=console
        )

    def _set_up(self, model: nn.Module) -> Unit:
        """The unit of ``model`` as run.setup returned it, or of the module inside it."""
        for unit in self.tracked.units:  # the model run.setup returned: the usual case, first
            if model is unit.module:
                return unit
        model = getattr(model, "_orig_mod", model)  # torch.compile(model) of a set-up model
        for unit in self.tracked.units:
            if model is unit.module or model is self.strategy.unwrap(unit.module):
                return unit
        raise ConfigError(
            f"run.accumulate got a {type(model).__name__} that run.setup did not return. Pass the "
            "model as returned by run.setup(model, ...) (its gradients are the ones to hold)."
        )

    def _attach(self, optimizer: Optimizer) -> Unit:
        unit = self.tracked.attach_optimizer(optimizer)
        self.precision.optimizers.add(id(optimizer))
        return unit

    def accumulation_window(self, model: nn.Module | None = None) -> int:
        """Micro-batches of ``model``'s accumulation window not yet applied by a step (0 right
        after a step); ``model`` may be left out when one model is set up."""
        unit = self.tracked.only_unit("run.accumulation_window") if model is None else None
        unit = unit or (self._set_up(model) if model is not None else None)
        window = self._windows.of(id(unit.module)) if unit is not None else None
        return window.count if window is not None and window.pending else 0

    def set_grad_accum(self, every: int) -> None:
        """Change the micro-batches per step (right after a step, never inside a window)."""
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"grad_accum must be a positive integer, got {every!r}.")
        self._windows.set_every(every)
        changed = every != self.config.grad_accum
        self.loop.grad_accum = self.config.grad_accum = every
        if changed:
            self._record_settings()

    def _progress(self) -> None:
        self._hooks.progress()

    def _default_step(self) -> int:
        return self.loop.global_step

    # -- checkpoints ----------------------------------------------------------------------
    @property
    def store(self) -> CheckpointStore:
        """Where checkpoints of this run go (``ckpt_dir``, default ``run_dir/checkpoints``)."""
        return self._checkpoints.store

    def save(
        self,
        *,
        extras: dict[str, Any] | None = None,
        model: nn.Module | None = None,
        optimizer: Optimizer | None = None,
        scheduler: Any = None,
    ) -> Path | None:
        """Checkpoint everything registered (collective: every rank calls it). ``model``,
        ``optimizer``, ``scheduler`` are registered first if new. Returns the folder."""
        self._hooks.loop_action(saving=True)
        self._register(model, optimizer, scheduler)
        return self._checkpoints.save(extras)

    def _register(self, model: Any, optimizer: Any, scheduler: Any) -> None:
        if model is not None and not any(u.module is model for u in self.tracked.units):
            raise ConfigError("run.save/resume(model=...) must be a model returned by run.setup.")
        if optimizer is not None and self.tracked.unit_of(optimizer) is None:
            self._attach(optimizer)
        if scheduler is not None:
            self.tracked.add_scheduler(scheduler)
        self._print_notes()

    def resume(
        self,
        *,
        model: nn.Module | None = None,
        optimizer: Optimizer | None = None,
        scheduler: Any = None,
        keep_global_batch: bool | None = None,
    ) -> dict[str, Any] | None:
        """Restore everything registered from the newest valid checkpoint (read every call: a
        rollback too); return its extras, or None. Later registrations get their state then.

        ``keep_global_batch``: when the world size differs from the checkpoint's, True keeps
        the saved global batch by changing grad_accum, False keeps grad_accum and reports the
        new global batch; None (the default) keeps it in a restarted worker (an elastic job
        that lost or gained a node) and reports it otherwise."""
        self._register(model, optimizer, scheduler)
        keep = self.restart_count > 0 if keep_global_batch is None else keep_global_batch
        return self._checkpoints.resume(keep_global_batch=keep)

    def latest_checkpoint(self) -> CheckpointInfo | None:
        """The newest valid checkpoint's step, epoch, manifest and extras, readable before
        ``run.setup`` (build the model from values stored in it). Collective; None if none."""
        return self._checkpoints.latest()

    def _print_notes(self) -> None:
        for note in self.tracked.notes:
            self.console.print(f"paratrain: {note}")
        self.tracked.notes.clear()

    def _before_close(self) -> None:
        preemption = getattr(self, "_preemption", None)
        if preemption is not None:
            preemption.uninstall()
            if preemption.received is not None and hasattr(self, "_checkpoints"):
                self._checkpoints.preempted_unsaved()
        if getattr(self, "_profiler", None) is not None:
            unfinished = self._profiler.close()  # type: ignore[union-attr]
            if unfinished:
                self.console.warn(unfinished)
        if hasattr(self, "_checkpoints"):
            self._checkpoints.close()
        if getattr(self, "_stats", None) is not None:
            self._stats.close()  # type: ignore[union-attr]
        if hasattr(self, "tracked"):
            for loader in self.tracked.loaders:
                loader.shutdown_workers()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: Any) -> None:
        """Close; an out-of-memory error is first explained (:mod:`paratrain.runtime.oom`)."""
        error = exc[1] if len(exc) > 1 else None
        try:
            if (
                isinstance(error, BaseException)
                and self._plan is None
                and oom.is_out_of_memory(error)
            ):
                try:
                    text = oom.report(self, error)
                except Exception as failed:  # the report must never hide the error itself
                    text = f"out of memory; no report ({type(failed).__name__}: {failed})"
                print(f"paratrain: {text}", file=sys.stderr, flush=True)
        finally:
            self.close()

    def __repr__(self) -> str:
        where = f"rank={self.rank}, world_size={self.world_size}, device={str(self.device)!r}"
        return f"Run(strategy={self.strategy.name!r}, {where}, run_dir={str(self.run_dir)!r})"


class _MicroBatch:
    """The block of one micro-batch (``run.accumulate``): a class rather than a generator, as
    it runs at every step (a generator-based context manager costs a microsecond more)."""

    __slots__ = ("_no_sync", "_run", "_wrapped")

    def __init__(self, run: Run, wrapped: nn.Module) -> None:
        self._run, self._wrapped = run, wrapped  # no_sync works on the wrapper
        self._no_sync: contextlib.AbstractContextManager[Any] | None = None

    def __enter__(self) -> None:
        run, key = self._run, id(self._wrapped)
        window = run._windows.begin(key, last=run._hooks.last_micro_batch(key))
        if not window.sync:
            try:
                self._no_sync = run.strategy.no_sync(self._wrapped)
                self._no_sync.__enter__()
            except BaseException:
                run._windows.end(key)
                raise

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._no_sync is not None:
                self._no_sync.__exit__(*exc)
        finally:
            self._run._windows.end(id(self._wrapped))
