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
``run.setup(scheduler=)``, ``run.step(opt, sched)`` or ``run.resume(scheduler=)``, training loaders
by ``run.loader``, anything else with ``state_dict``/``load_state_dict`` by ``run.track``. Own
``while`` loops work the same way: count with ``run.global_step``. The same script runs as
``python train.py`` (one process), under ``torchrun`` or ``paratrain run`` (one process per
device), or inside a Slurm allocation; after a torchrun restart the run resumes by itself at the
first training action (``run.epochs``, a training loader's pass, ``accumulate``, ``backward``,
``step``, ``save``, or reading ``run.global_step``/``run.epoch``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import Dataset

from paratrain import collectives, data
from paratrain.accumulation import Windows
from paratrain.activation_checkpointing import apply_activation_checkpointing
from paratrain.checkpoint import resume as checkpoints
from paratrain.checkpoint.files import atomic_torch_save
from paratrain.checkpoint.store import CheckpointStore
from paratrain.config import RunConfig
from paratrain.console import Console
from paratrain.environment import LaunchEnv
from paratrain.errors import ConfigError
from paratrain.loop_state import LoopState
from paratrain.model_setup import check_model, forward_in_autocast, model_devices, rebind_optimizer
from paratrain.precision import Precision
from paratrain.process_group import destroy_process_group, init_process_group
from paratrain.run_dir import RunDir
from paratrain.run_loop import LoopHooks, StepRounds
from paratrain.seeding import rank_seed, seed_everything
from paratrain.stats import StatsWriter
from paratrain.strategies import select_strategy
from paratrain.topology import Topology
from paratrain.tracking import Tracked, Unit
from paratrain.watchdog import Watchdog

T = TypeVar("T")
Number = TypeVar("Number", int, float, torch.Tensor)


class Run:
    """A training run on this process's share of the job. See the module docstring for a loop.

    Attributes: ``config``, ``topology``, ``strategy``, ``device``, ``rank``, ``local_rank``,
    ``world_size``, ``is_main``, ``epoch``, ``global_step``, ``run_dir``, ``restart_count``,
    ``rank_seed``, ``extras``, ``resumed_from``, ``last_grad_norm``, ``store``, ``console``.
    """

    def __init__(self, config: RunConfig | None = None, /, **settings: Any) -> None:
        if config is not None and settings:
            raise ConfigError("Pass either a RunConfig or keyword settings to Run, not both.")
        config = config if config is not None else RunConfig(**settings)
        config.validate()  # a config changed after creation is checked again
        env = LaunchEnv.read()
        self._env = env
        self.config = dataclasses.replace(
            config,
            backend=config.backend or env.backend,
            run_dir=env.resolve_run_dir(config.run_dir),
        )
        self.layout = RunDir(self.config.run_dir or ".")
        """Where this run writes (:class:`paratrain.run_dir.RunDir`)."""
        self.topology = _topology()
        selection = select_strategy(self.config, self.topology)
        self.strategy = selection.strategy
        self.precision = Precision(self.config.precision, self.device)
        self.console = Console(
            is_main=self.topology.is_main,
            run_dir=self.layout.root,
            tensorboard=self.config.tensorboard,
            progress=self.config.progress,
        )
        self._closed = False
        self._owns_group = False
        self._watchdog: Watchdog | None = None
        try:
            self._start(selection.backend)
        except BaseException:
            self.close()
            raise
        seed_everything(self.config.seed)
        self.loop = LoopState(grad_accum=self.config.grad_accum)
        """Epoch, step and grad_accum (saved by every checkpoint)."""
        self.tracked = Tracked()
        """Everything a checkpoint holds (models, optimizers, schedulers, loaders, objects)."""
        self.last_grad_norm: float | None = None
        """Gradient norm before clipping at the last step (when ``max_grad_norm`` is set)."""
        self.extras: dict[str, Any] = {}
        """The extras of the checkpoint this run resumed from (empty for a fresh run)."""
        self.resumed_from: Path | None = None
        """The checkpoint folder this run resumed from, or None."""
        self._windows = Windows(self.config.grad_accum)
        self._rounds = StepRounds()
        self._hooks = LoopHooks(self)
        self._identity = checkpoints.Identity(run_id=self._run_id(), lineage="")
        self._identity.lineage = self._identity.run_id
        self._auto_resume = self.restart_count > 0
        self._rank_streams = False
        self._resumed_at_step: int | None = None
        self._restart_recorded = False
        self._store: CheckpointStore | None = None
        self._batch_reported = False
        self._gloo: Any = None
        if self.config.per_rank_batch is not None:
            self._hooks.first_loader(self.config.per_rank_batch)
        self._stats = (
            StatsWriter(
                self.layout.stats, rank=self.rank, every=self.config.stats_every, device=self.device
            )
            if self.config.stats_every
            else None
        )
        self.console.print(
            f"paratrain: strategy {self.strategy.name} ({selection.reason}), "
            f"world size {self.world_size}, device {self.device.type}, "
            f"backend {selection.backend if self.strategy.multi_process else '-'}, "
            f"precision {self.config.precision}"
        )

    def _start(self, backend: str) -> None:
        """Process group, watchdog and launcher report: after every setting was checked."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.topology.is_main:
            shutil.rmtree(self.layout.stacks / "", ignore_errors=True)  # an earlier job's stalls
            self._env.write_report(
                {
                    "run_dir": str(self.layout.root.resolve()),
                    "ckpt_dir": str(Path(self._ckpt_dir()).resolve()),
                    "world_size": self.topology.world_size,
                }
            )
        if self.strategy.multi_process:
            self._owns_group = init_process_group(
                self.topology,
                backend=backend,
                timeout_s=self.config.timeout_s,
                trace_dir=str(self.layout.stacks),
            )
        if self.strategy.multi_process and self.config.watchdog and self.world_size > 1:
            self._watchdog = Watchdog(
                self.layout.stacks, rank=self.rank, after_s=0.9 * self.config.timeout_s
            )

    def _run_id(self) -> str:
        ids: list[Any] = [self._env.job_id or uuid.uuid4().hex[:12]]
        if self.world_size > 1 and dist.is_initialized():
            dist.broadcast_object_list(ids, src=0)
        return str(ids[0])

    # -- where this process is -------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """The device this rank computes on (``cuda:<local rank>`` or ``cpu``)."""
        return self.strategy.device

    @property
    def rank(self) -> int:
        """Index of this process in the job."""
        return self.topology.rank

    @property
    def local_rank(self) -> int:
        """Index of this process on its machine."""
        return self.topology.local_rank

    @property
    def world_size(self) -> int:
        """Number of processes in the job."""
        return self.topology.world_size

    @property
    def is_main(self) -> bool:
        """True on rank 0."""
        return self.topology.is_main

    @property
    def run_dir(self) -> Path:
        """Where this run writes logs, stats and (by default) checkpoints."""
        return self.layout.root

    @property
    def restart_count(self) -> int:
        """How often torchrun restarted this job's workers (0 on the first start)."""
        return self._env.restart_count

    @property
    def rank_seed(self) -> int:
        """This rank's seed: ``seed`` on rank 0, a distinct value derived from it elsewhere.

        From the first ``run.setup`` on, python/numpy/torch generators follow it, so dropout,
        augmentation and ``torch.randint`` batch sampling differ across ranks. Seed your own
        generators with it: ``torch.Generator().manual_seed(run.rank_seed)``."""
        return rank_seed(self.config.seed, self.rank)

    @property
    def epoch(self) -> int:
        """Current epoch (0-based), advanced by :meth:`epochs`; restored by a resume."""
        self._hooks.resume_if_restarted()
        return self.loop.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.loop.epoch = value

    @property
    def global_step(self) -> int:
        """Optimizer steps so far (several optimizers stepping in one round count once)."""
        self._hooks.resume_if_restarted()
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
    ) -> Any:
        """Place and wrap ``model`` for the strategy; rebind its ``optimizers``; register all.

        Returns the model, or ``(model, optimizer, ...)`` when optimizers are given. ``name``
        keys the model in checkpoints (default ``model``, ``model_1``, ... in setup order)."""
        check_model(model)
        names = {id(p): n for n, p in model.named_parameters()}
        devices = model_devices(model)
        if self.config.activation_checkpointing:
            apply_activation_checkpointing(model, self.config.activation_checkpointing)
        if len(devices) > 1:
            wrapped = self.strategy.wrap_split(model, devices)
        else:
            wrapped = self.strategy.wrap(model)
        if self.precision.dtype is not None:
            forward_in_autocast(self.strategy.unwrap(wrapped), self.precision)
        wrapped._paratrain_setup = True  # type: ignore[assignment]
        params = dict(self.strategy.unwrap(wrapped).named_parameters())
        for optimizer in optimizers:
            rebind_optimizer(optimizer, names, params)
            self.precision.optimizers.add(id(optimizer))
        self.tracked.add_unit(wrapped, list(optimizers), name)
        if scheduler is not None:
            self.tracked.add_scheduler(scheduler)
        self._hooks.start_rank_streams()
        self._print_notes()
        return (wrapped, *optimizers) if optimizers else wrapped

    def track(self, obj: T, name: str | None = None) -> T:
        """Save and restore ``obj`` (anything with ``state_dict``/``load_state_dict``: an EMA
        model, a metric, a data-order object) with every checkpoint; returns ``obj``."""
        self.tracked.add_object(obj, name)
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
        return data.make_loader(
            dataset,
            batch_size,
            train=train,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=self.config.seed,
            topology=self.topology,
            device=self.device,
            num_workers=kwargs.pop("num_workers", self.config.num_workers),
            hooks=self._hooks,
            name="loader" if train else "eval_loader",
            kwargs=kwargs,
        )

    # -- the loop -------------------------------------------------------------------------
    def epochs(self, count: int) -> Iterator[int]:
        """Yield epoch numbers from the current one up to ``count - 1``; samplers follow them."""
        self._hooks.loop_action()
        while self.loop.epoch < count:
            yield self.loop.epoch
            self._hooks.drop_unfinished_windows()
            self.loop.epoch += 1

    def progress(self, iterable: Iterable[T], *, desc: str | None = None) -> Iterator[T]:
        """A progress bar on the main process; the bare iterable on the other ranks."""
        self._hooks.loop_action()
        return self.console.progress(iterable, desc=desc or f"epoch {self.loop.epoch}")

    @contextlib.contextmanager
    def accumulate(self, model: nn.Module) -> Iterator[None]:
        """Run one micro-batch of ``model``; its gradients sync only on a window's last one."""
        self._hooks.loop_action()
        key = id(model)
        window = self._windows.begin(key, last=self._hooks.last_micro_batch(key))
        try:
            if window.sync:
                yield
            else:
                with self.strategy.no_sync(model):
                    yield
        finally:
            self._windows.end(key)

    def backward(self, loss: torch.Tensor, **backward_kwargs: Any) -> None:
        """``loss.backward(**backward_kwargs)`` with the loss divided by ``grad_accum`` and
        scaled for fp16 (``retain_graph=``, ``inputs=``, ``create_graph=`` pass through)."""
        self._hooks.loop_action()
        if self.loop.grad_accum > 1:
            loss = loss / self.loop.grad_accum
        self.precision.scale(loss).backward(**backward_kwargs)  # type: ignore[no-untyped-call]

    def step(self, optimizer: Optimizer, scheduler: Any = None) -> bool:
        """At the end of ``optimizer``'s window: unscale, clip, step, zero_grad, step the
        ``scheduler`` (registered for checkpoints). Returns True if the optimizer stepped."""
        self._hooks.loop_action()
        unit = self.tracked.unit_of(optimizer) or self._attach(optimizer)
        if scheduler is not None:
            self.tracked.add_scheduler(scheduler)
            self._print_notes()
        window = self._windows.of(id(unit.module))
        if window is None and self.loop.grad_accum > 1:
            raise ConfigError(
                f"grad_accum={self.loop.grad_accum} but no `with run.accumulate(model):` block "
                "ran for this optimizer's model, so run.step cannot tell micro-batches from "
                "steps. Put the forward and run.backward inside `with run.accumulate(model):`."
            )
        if window is not None and (not window.sync or id(optimizer) in window.stepped):
            return False
        self.precision.unscale_(optimizer)
        correction = window.correction() if window is not None else 1.0
        if correction != 1.0 or self.config.max_grad_norm is not None:
            params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            if correction != 1.0:
                torch._foreach_mul_([p.grad for p in params], correction)
            if self.config.max_grad_norm is not None:
                self.last_grad_norm = self.strategy.clip_grad_norm(
                    params, self.config.max_grad_norm
                )
        stepped = self.precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        if window is not None:
            window.stepped.add(id(optimizer))
        if stepped:
            if self._rounds.count(optimizer):
                self.loop.global_step += 1
            self._hooks.progress()
            if scheduler is not None:
                scheduler.step()
            if self._stats is not None:
                loaders = self.tracked.loaders
                self._stats.step(
                    step=self.loop.global_step,
                    samples=sum(ld.samples for ld in loaders),
                    data_wait_s=sum(ld.data_wait_s for ld in loaders),
                )
        return stepped

    def _attach(self, optimizer: Optimizer) -> Unit:
        unit = self.tracked.attach_optimizer(optimizer)
        self.precision.optimizers.add(id(optimizer))
        return unit

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Autocast for code outside the model's forward (the model's forward already is)."""
        with self.precision.autocast():
            yield

    def uneven_inputs(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """For loops whose ranks run different numbers of batches: no rank hangs at the end."""
        return self.strategy.uneven_inputs(model)

    def set_grad_accum(self, every: int) -> None:
        """Change the micro-batches per step (right after a step, never inside a window)."""
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"grad_accum must be a positive integer, got {every!r}.")
        self._windows.set_every(every)
        self.loop.grad_accum = self.config.grad_accum = every

    # -- metrics, output, files -------------------------------------------------------------
    def reduce(self, value: Number, op: str = "sum") -> Number:
        """All-reduce a number, numpy value or tensor over ranks (sum, mean, max, min)."""
        return collectives.reduce(value, op, device=self.device)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` in rank order, on every rank."""
        return collectives.gather(value)

    def barrier(self, name: str | None = None) -> None:
        """Wait until every rank gets here; a ``name`` also checks they all reached the same
        barrier, and names the ranks that did not arrive within ``timeout_s``."""
        self._hooks.progress()
        if self.strategy.multi_process and dist.is_initialized():
            if name is None:
                dist.barrier()
            else:
                collectives.named_barrier(
                    name, timeout_s=self.config.timeout_s, group=self._gloo_group()
                )
        self._hooks.progress()

    def _gloo_group(self) -> Any:
        """The default group when it is gloo, else a gloo group made once (a collective)."""
        if dist.get_backend() == "gloo":
            return None
        if self._gloo is None:
            self._gloo = dist.new_group(backend="gloo")
        return self._gloo

    def print(self, *values: object, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        self.console.print(*values, **kwargs)

    def get_logger(self, name: str = "paratrain") -> logging.Logger:
        """A ``logging.Logger`` that emits on the main process only."""
        return self.console.logger(name)

    def log(self, metrics: Mapping[str, float], *, step: int | None = None) -> None:
        """Record scalars (main process): ``run_dir/metrics.jsonl`` and TensorBoard if enabled."""
        self.console.log(metrics, step=self.loop.global_step if step is None else step)

    def save_weights(self, model: nn.Module, path: str | Path) -> Path:
        """Save the full, unprefixed weights to ``path`` (collective; the main process writes)."""
        self.strategy.sync_buffers(model)
        state = self.strategy.full_state_dict(model)
        path = Path(path)
        if self.is_main:
            atomic_torch_save(state, path)
        self.barrier()
        return path

    # -- checkpoints ----------------------------------------------------------------------
    def _ckpt_dir(self) -> Path:
        return Path(self.config.ckpt_dir) if self.config.ckpt_dir else self.layout.checkpoints

    @property
    def store(self) -> CheckpointStore:
        """Where checkpoints of this run go (``ckpt_dir``, default ``run_dir/checkpoints``)."""
        if self._store is None:
            self._store = CheckpointStore(
                self._ckpt_dir(),
                keep_last=self.config.keep_last,
                check_timeout_s=self.config.timeout_s,
                warn=self.console.warn,
            )
        return self._store

    def _pieces(self) -> checkpoints.Pieces:
        layout = checkpoints.Layout(
            strategy=self.strategy.name,
            world_size=self.world_size,
            rank=self.rank,
            sharded=self.strategy.sharded_state,
            seed=self.config.seed,
            unwrap=self.strategy.unwrap,
        )
        return checkpoints.Pieces(
            tracked=self.tracked, loop=self.loop, precision=self.precision, layout=layout
        )

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
        self._hooks.loop_action()
        self._register(model, optimizer, scheduler)
        pending = self._windows.pending()
        if pending:
            raise ConfigError(
                "run.save() was called inside an accumulation window (gradients of "
                f"{max(w.count for w in pending)} micro-batch(es) not yet applied). Call it "
                "right after run.step(), when a step has been taken."
            )
        if self.tracked.pending:
            self.console.warn(
                f"the resumed checkpoint holds {sorted(self.tracked.pending)}, which this run "
                "never registered; this save does not contain them. Register them (run.setup("
                "..., name=), run.track(obj, name=), run.loader) before saving to keep them."
            )
        for unit in self.tracked.units:
            self.strategy.sync_buffers(unit.module)
        return checkpoints.save(
            self._pieces(),
            self.store,
            self._identity,
            extras,
            background=self.config.async_save,
        )

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
        keep_global_batch: bool = False,
    ) -> dict[str, Any] | None:
        """Continue from the newest valid checkpoint; return its extras, or None if none.

        Everything registered is restored; state for something registered later (a scheduler
        first given to run.step) is applied when it is registered."""
        self._register(model, optimizer, scheduler)
        if self._resumed_at_step is not None and self._resumed_at_step == self.loop.global_step:
            return self.extras if self.resumed_from is not None else None  # resumed already
        return self._hooks.resume(keep_global_batch=keep_global_batch)

    def latest_checkpoint(self) -> checkpoints.CheckpointInfo | None:
        """The newest valid checkpoint's step, epoch, manifest and extras, readable before
        ``run.setup`` (build the model from values stored in it). Collective; None if none."""
        return checkpoints.latest(self.store, self.rank)

    def _print_notes(self) -> None:
        for note in self.tracked.notes:
            self.console.print(f"paratrain: {note}")
        self.tracked.notes.clear()

    def _record_restart(self, resumed: bool) -> None:
        if not self.is_main:
            return
        record = {
            "time": time.time(),
            "restart": self.restart_count,
            "step": self.loop.global_step,
            "epoch": self.loop.epoch,
            "resumed": resumed,
            "checkpoint_dir": str(self.store.directory),
        }
        self.layout.restarts.parent.mkdir(parents=True, exist_ok=True)
        with self.layout.restarts.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Close logs and destroy the process group this run created. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.stop()
        try:
            if getattr(self, "_store", None) is not None:
                self.store.wait()
        finally:
            if hasattr(self, "console"):
                self.console.close()
            destroy_process_group(self._owns_group)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Run(strategy={self.strategy.name!r}, rank={self.rank}, world_size="
            f"{self.world_size}, device={str(self.device)!r}, run_dir={str(self.run_dir)!r})"
        )


def _topology() -> Topology:
    topo = Topology.from_env()
    if topo.source == "none" and dist.is_available() and dist.is_initialized():
        # The caller built the process group (a notebook, a test harness): take its layout.
        rank, world = dist.get_rank(), dist.get_world_size()
        return Topology(
            rank=rank,
            local_rank=rank,
            world_size=world,
            local_world_size=world,
            master_addr=topo.master_addr,
            master_port=topo.master_port,
            source="process group",
        )
    return topo
