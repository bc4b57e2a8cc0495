"""``Run``: one object that owns the process group, the strategy, precision and the step logic.

    import paratrain as pt

    with pt.Run(strategy="auto", precision="bf16", grad_accum=4, max_grad_norm=1.0) as run:
        model, optimizer = run.setup(model, optimizer)
        loader = run.loader(train_set, batch_size=32, shuffle=True)      # per-rank batch
        for epoch in run.epochs(10):
            for x, y in run.progress(loader):                           # already on run.device
                with run.accumulate(model):
                    loss = criterion(model(x), y)
                    run.backward(loss)
                run.step(optimizer, scheduler)          # steps only at the end of a window
            run.print(f"epoch {epoch}: loss {run.reduce(loss.item(), 'mean'):.3f}")

The same script runs as ``python train.py`` (one process), under ``torchrun`` or ``paratrain run``
(one process per device), or inside a Slurm allocation.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, overload

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import Dataset

from paratrain import checkpointing, collectives, data
from paratrain.accumulation import Accumulation
from paratrain.activation_checkpointing import apply_activation_checkpointing
from paratrain.checkpoint.files import atomic_torch_save
from paratrain.checkpoint.store import CheckpointStore
from paratrain.config import RunConfig
from paratrain.console import Console
from paratrain.errors import ConfigError
from paratrain.model_setup import check_model, forward_in_autocast, rebind_optimizer
from paratrain.precision import Precision
from paratrain.process_group import destroy_process_group, init_process_group
from paratrain.seeding import seed_everything
from paratrain.stats import StatsWriter
from paratrain.strategies import select_strategy
from paratrain.topology import Topology
from paratrain.watchdog import Watchdog

T = TypeVar("T")
Number = TypeVar("Number", int, float, torch.Tensor)


class Run:
    """A training run on this process's share of the job. See the module docstring for a loop."""

    def __init__(self, config: RunConfig | None = None, /, **settings: Any) -> None:
        if config is not None and settings:
            raise ConfigError("Pass either a RunConfig or keyword settings to Run, not both.")
        self.config = config if config is not None else RunConfig(**settings)
        self.topology = _topology()
        selection = select_strategy(self.config, self.topology)
        self.strategy = selection.strategy
        self.device = self.strategy.device
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._owns_group = False
        if self.strategy.multi_process:
            self._owns_group = init_process_group(
                self.topology,
                backend=selection.backend,
                timeout_s=self.config.timeout_s,
                trace_dir=str(Path(self.config.run_dir) / "stacks"),
            )
        self._watchdog = (
            Watchdog(
                Path(self.config.run_dir) / "stacks",
                rank=self.rank,
                after_s=0.9 * self.config.timeout_s,
            )
            if self.strategy.multi_process and self.config.watchdog and self.world_size > 1
            else None
        )
        self.console = Console(
            is_main=self.topology.is_main,
            run_dir=self.config.run_dir,
            tensorboard=self.config.tensorboard,
            progress=self.config.progress,
        )
        self.precision = Precision(self.config.precision, self.device)
        seed_everything(self.config.seed)
        self.epoch = 0
        """Current epoch (0-based), advanced by :meth:`epochs`."""
        self.global_step = 0
        """Optimizer steps taken so far."""
        self.last_grad_norm: float | None = None
        """Gradient norm before clipping at the last step (when ``max_grad_norm`` is set)."""
        self._accum = Accumulation(self.config.grad_accum)
        self._train_loaders: list[data.DeviceLoader[Any]] = []
        self._active_loader: data.DeviceLoader[Any] | None = None
        self._resume_offset: tuple[int, int] | None = None
        self._store: CheckpointStore | None = None
        self.tracked_model: nn.Module | None = None
        """The model last returned by :meth:`setup` (what :meth:`save` saves by default)."""
        self.tracked_optimizer: Optimizer | None = None
        """The optimizer last passed to :meth:`setup`."""
        self.tracked_scheduler: Any = None
        """The scheduler last passed to :meth:`step`."""
        self._optimizers: list[Optimizer] = []
        self._batch_reported = False
        self._resumed = False
        self._gloo: Any = None
        self.restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        """How often torchrun restarted this job's workers (0 on the first start)."""
        self._stats = (
            StatsWriter(
                Path(self.config.run_dir) / "stats",
                rank=self.rank,
                every=self.config.stats_every,
                device=self.device,
            )
            if self.config.stats_every
            else None
        )
        self._closed = False
        self.console.print(
            f"paratrain: strategy {self.strategy.name} ({selection.reason}), "
            f"world size {self.world_size}, device {self.device.type}, "
            f"backend {selection.backend if self.strategy.multi_process else '-'}, "
            f"precision {self.config.precision}"
        )

    # -- where this process is -------------------------------------------------------------
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

    # -- model and optimizer ---------------------------------------------------------------
    @overload
    def setup(self, model: nn.Module) -> nn.Module: ...
    @overload
    def setup(self, model: nn.Module, optimizer: Optimizer) -> tuple[nn.Module, Optimizer]: ...

    def setup(
        self, model: nn.Module, optimizer: Optimizer | None = None
    ) -> nn.Module | tuple[nn.Module, Optimizer]:
        """Place and wrap ``model`` for the strategy; rebind ``optimizer`` to its parameters."""
        check_model(model)
        names = {id(p): name for name, p in model.named_parameters()}
        if self.config.activation_checkpointing:
            apply_activation_checkpointing(model, self.config.activation_checkpointing)
        wrapped = self.strategy.wrap(model)
        if self.precision.dtype is not None:
            forward_in_autocast(wrapped, self.precision)
        wrapped._paratrain_setup = True  # type: ignore[assignment]
        self.tracked_model = wrapped
        if optimizer is None:
            return wrapped
        self.tracked_optimizer = optimizer
        rebind_optimizer(optimizer, names, dict(self.strategy.unwrap(wrapped).named_parameters()))
        return wrapped, optimizer

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
        """A training loader: ``batch_size`` samples per rank, sharded and reshuffled each epoch."""
        loader = self._build(dataset, batch_size, True, shuffle, drop_last, dataloader_kwargs)
        self._train_loaders.append(loader)
        if not self._batch_reported:
            self._batch_reported = True
            world, accum = self.world_size, self.config.grad_accum
            self.console.print(
                f"paratrain: global batch {batch_size * world * accum} = per-rank batch "
                f"{batch_size} x world size {world} x grad_accum {accum}"
            )
        return loader

    def eval_loader(
        self, dataset: Dataset[Any], batch_size: int, **dataloader_kwargs: Any
    ) -> data.DeviceLoader[Any]:
        """An evaluation loader in which every sample is seen by exactly one rank, once."""
        return self._build(dataset, batch_size, False, False, False, dataloader_kwargs)

    def _build(
        self,
        dataset: Dataset[Any],
        batch_size: int,
        train: bool,
        shuffle: bool,
        drop_last: bool,
        kwargs: dict[str, Any],
    ) -> data.DeviceLoader[Any]:
        device_loader = data.make_loader(
            dataset,
            batch_size,
            train=train,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=self.config.seed,
            topology=self.topology,
            device=self.device,
            num_workers=kwargs.pop("num_workers", self.config.num_workers),
            epoch=lambda: self.epoch,
            start=self._pass_start if train else None,
            kwargs=kwargs,
        )
        device_loader.on_batch = self._progress
        return device_loader

    def _pass_start(self, loader: data.DeviceLoader[Any], epoch: int) -> int:
        """Called as a training loader starts a pass: the samples to skip (resumed runs)."""
        self._active_loader = loader
        if self._resume_offset is not None and self._resume_offset[0] == epoch:
            offset, self._resume_offset = self._resume_offset[1], None
            return offset
        return 0

    def active_loader(self, *, any_pass: bool = False) -> data.DeviceLoader[Any] | None:
        """The training loader of the current pass (or, with ``any_pass``, the newest one)."""
        if self._active_loader is None and any_pass and self._train_loaders:
            return self._train_loaders[-1]
        return self._active_loader

    # -- the loop -------------------------------------------------------------------------
    def epochs(self, count: int) -> Iterator[int]:
        """Yield epoch numbers from the current one up to ``count - 1``; samplers follow them.

        After a torchrun restart (``TORCHELASTIC_RESTART_COUNT`` > 0) the first call resumes from
        the newest valid checkpoint if the script has not called :meth:`resume` itself.
        """
        if self.restart_count > 0 and not self._resumed:
            checkpointing.resume_after_restart(self)
        while self.epoch < count:
            yield self.epoch
            self._drop_unfinished_window()
            self.epoch += 1

    def progress(self, iterable: Iterable[T], *, desc: str | None = None) -> Iterator[T]:
        """A progress bar on the main process; the bare iterable on the other ranks."""
        return self.console.progress(iterable, desc=desc or f"epoch {self.epoch}")

    @contextlib.contextmanager
    def accumulate(self, model: nn.Module) -> Iterator[None]:
        """Run one micro-batch; gradients are synchronised only on the last of a window."""
        active = [ld for ld in self._train_loaders if ld.batches_left is not None]
        last_batch = bool(active) and active[-1].batches_left == 0
        if self._accum.begin(last_batch=last_batch):
            yield
        else:
            with self.strategy.no_sync(model):
                yield

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` with the loss divided by ``grad_accum`` and scaled for fp16."""
        self._progress()
        if self.config.grad_accum > 1:
            loss = loss / self.config.grad_accum
        self.precision.scale(loss).backward()  # type: ignore[no-untyped-call]

    def step(self, optimizer: Optimizer, scheduler: Any = None) -> bool:
        """At the end of a window: unscale, clip, step, zero_grad, scheduler. True if stepped."""
        if not self._accum.used and self.config.grad_accum > 1:
            raise ConfigError(
                f"grad_accum={self.config.grad_accum} but no `with run.accumulate(model):` block "
                "was run, so run.step cannot tell micro-batches from steps. Put the forward and "
                "run.backward inside `with run.accumulate(model):`."
            )
        self._progress()
        if self._accum.used and not self._accum.sync:
            return False
        if optimizer not in self._optimizers:
            self._optimizers.append(optimizer)
        if scheduler is not None:
            self.tracked_scheduler = scheduler
        self.precision.unscale_(optimizer)
        correction = self._accum.correction()
        if correction != 1.0 or self.config.max_grad_norm is not None:
            params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            if correction != 1.0:
                torch._foreach_mul_([p.grad for p in params], correction)
            if self.config.max_grad_norm is not None:
                norm = self.strategy.clip_grad_norm(params, self.config.max_grad_norm)
                self.last_grad_norm = norm
        stepped = self.precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        self._accum.reset()
        if stepped:
            self.global_step += 1
            self._progress()
            if scheduler is not None:
                scheduler.step()
            if self._stats is not None:
                self._stats.step(
                    step=self.global_step,
                    samples=sum(ld.samples for ld in self._train_loaders),
                    data_wait_s=sum(ld.data_wait_s for ld in self._train_loaders),
                )
        return stepped

    def _progress(self) -> None:
        if self._watchdog is not None:
            self._watchdog.progress(self.global_step)

    def _drop_unfinished_window(self) -> None:
        if self._accum.window == 0:
            return
        self.console.warn(
            f"epoch {self.epoch} ended with {self._accum.window} micro-batch(es) of an unfinished "
            "accumulation window; their gradients were dropped. Use run.loader (it knows its "
            "length and steps on the last batch) or a loader with __len__."
        )
        for optimizer in self._optimizers:
            optimizer.zero_grad(set_to_none=True)
        self._accum.reset()

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Autocast for code outside the model's forward (the model's forward already is)."""
        with self.precision.autocast():
            yield

    def uneven_inputs(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """For loops whose ranks run different numbers of batches: no rank hangs at the end."""
        return self.strategy.uneven_inputs(model)

    # -- metrics, output, files -------------------------------------------------------------
    def reduce(self, value: Number, op: str = "sum") -> Number:
        """All-reduce a number or tensor over ranks (sum, mean, max, min)."""
        return collectives.reduce(value, op, device=self.device)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` in rank order, on every rank."""
        return collectives.gather(value)

    def barrier(self, name: str | None = None) -> None:
        """Wait until every rank gets here; a ``name`` also checks they all reached the same
        barrier, and names the ranks that did not arrive within ``timeout_s``."""
        self._progress()
        if self.strategy.multi_process and dist.is_initialized():
            if name is None:
                dist.barrier()
            else:
                collectives.named_barrier(
                    name, timeout_s=self.config.timeout_s, group=self._gloo_group()
                )
        self._progress()

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
        self.console.log(metrics, step=self.global_step if step is None else step)

    def save_weights(self, model: nn.Module, path: str | Path) -> Path:
        """Save the full, unprefixed weights to ``path`` (collective; the main process writes)."""
        state = self.strategy.full_state_dict(model)
        path = Path(path)
        if self.is_main:
            atomic_torch_save(state, path)
        self.barrier()
        return path

    # -- checkpoints ----------------------------------------------------------------------
    @property
    def store(self) -> CheckpointStore:
        """Where checkpoints of this run go (``ckpt_dir``, default ``run_dir/checkpoints``)."""
        if self._store is None:
            self._store = checkpointing.make_store(self)
        return self._store

    def save(
        self,
        *,
        model: nn.Module | None = None,
        optimizer: Optimizer | None = None,
        scheduler: Any = None,
        extras: dict[str, Any] | None = None,
    ) -> Path | None:
        """Checkpoint the whole training state. Every rank calls it; see :mod:`checkpointing`."""
        return checkpointing.save(
            self, model=model, optimizer=optimizer, scheduler=scheduler, extras=extras
        )

    def resume(
        self,
        *,
        model: nn.Module | None = None,
        optimizer: Optimizer | None = None,
        scheduler: Any = None,
        keep_global_batch: bool = False,
    ) -> dict[str, Any] | None:
        """Continue from the newest valid checkpoint; return its extras, or None if none."""
        self._resumed = True
        return checkpointing.resume(
            self,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            keep_global_batch=keep_global_batch,
        )

    def resume_at(self, epoch: int, samples_in_epoch: int, step: int) -> None:
        """Continue the loop at ``epoch`` after ``samples_in_epoch`` samples, at ``step``."""
        self.epoch, self.global_step = epoch, step
        self._resume_offset = (epoch, samples_in_epoch)

    def accumulation_window(self) -> int:
        """Micro-batches run since the last optimizer step."""
        return self._accum.window

    def set_grad_accum(self, every: int) -> None:
        """Change the micro-batches per step (between steps only)."""
        self.config.grad_accum = every
        self._accum.every = every

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Close logs and destroy the process group this run created. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.stop()
        try:
            if self._store is not None:
                self._store.wait()
        finally:
            self.console.close()
        destroy_process_group(self._owns_group)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
