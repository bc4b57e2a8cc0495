"""``RunBase``: this process's place in the job, and what it does with the other ranks.

    job = RunBase(strategy="ddp", timeout_s=300)  # settings as for paratrain.Run
    job.rank, job.world_size, job.device, job.run_dir
    job.print("only rank 0 prints"); job.log({"loss": 0.3}, step=10)
    total = job.reduce(correct, "sum"); job.barrier("after-eval")
    job.close()

It resolves the settings against the launcher's environment, chooses the strategy, checks the
precision, and only then joins the process group and starts the hang watchdog, so a bad setting
leaves nothing behind. :class:`paratrain.Run` builds the training loop on top of it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import psutil
import torch
import torch.distributed as dist
from torch import nn

from paratrain.checkpoint.durable_writes import atomic_torch_save
from paratrain.checkpoint.object_storage import redacted
from paratrain.config import RunConfig, make_config
from paratrain.core.paths import check_creatable, check_output_file
from paratrain.core.run_dir import RunDir
from paratrain.core.version import __version__
from paratrain.distributed import collectives
from paratrain.distributed.collective_log import CollectiveLog
from paratrain.distributed.environment import LaunchEnv
from paratrain.distributed.process_group import destroy_process_group, init_process_group
from paratrain.distributed.stall import StallMonitor
from paratrain.distributed.topology import Topology
from paratrain.distributed.watchdog import Watchdog
from paratrain.errors import ModelError
from paratrain.runtime import plan_probe
from paratrain.runtime.console import Console
from paratrain.runtime.precision import Precision
from paratrain.strategies import select_strategy
from paratrain.trackers import open_trackers

Number = TypeVar("Number", int, float, torch.Tensor)


class RunBase:
    """Process group, strategy, precision, console and watchdog of one process of a job."""

    def __init__(self, config: RunConfig | None = None, /, **settings: Any) -> None:
        config = make_config(config, settings)
        self._plan = plan_probe.ACTIVE  # `paratrain plan` runs the script: one fake step
        self.rss_at_start = psutil.Process().memory_info().rss
        """Resident bytes when this run started (an out-of-memory report counts from it)."""
        if self._plan is not None:
            config = self._plan.config(config)
        self._env = env = LaunchEnv.read()
        self.config = dataclasses.replace(
            config,
            backend=config.backend or env.backend,
            run_dir=env.resolve_run_dir(config.run_dir),
        )
        if config.run_dir is None:  # the launcher's or the default: not checked by the config
            check_creatable(self.config.run_dir or ".", "run_dir")
        self.layout = RunDir(self.config.run_dir or ".")
        """Where this run writes (:class:`paratrain.core.run_dir.RunDir`)."""
        self.topology = Topology.from_env_or_group()
        self.selection = select_strategy(self.config, self.topology)
        self.strategy = self.selection.strategy
        self.precision = Precision(self.config.precision, self.device)
        self.console = Console(
            is_main=self.topology.is_main,
            run_dir=self.layout.root,
            progress=self.config.progress,
            trackers=open_trackers(
                self.config,
                self.layout,
                is_main=self.topology.is_main,
                hparams=self._settings_record,
                step=self._default_step,
            ),
        )
        self._closed = False
        self._started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self._owns_group = False
        self._watchdog: Watchdog | None = None
        self._collectives: CollectiveLog | None = None
        # Most scripts never close their run. Closed at interpreter exit instead, the process
        # group is destroyed while Python is still whole: left to finalization, gloo's worker
        # threads free their last work without a GIL to take, and the rank aborts (SIGABRT,
        # "terminate called without an active exception") after its training has ended.
        atexit.register(self.close)
        try:
            self._start(self.selection.backend)
        except BaseException:
            self.close()
            raise

    def _start(self, backend: str) -> None:
        """Process group, watchdog and launcher report: after every setting was checked."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.topology.is_main:
            shutil.rmtree(self.layout.stacks / "", ignore_errors=True)  # an earlier job's stalls
            self._record_settings()
            self._env.write_report(
                {
                    "run_dir": str(self.layout.root.resolve()),
                    "ckpt_dir": _shown(self.layout.checkpoints_at(self.config.ckpt_dir)),
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
            self._collectives = CollectiveLog(self.rank).install()
            monitor = StallMonitor(
                dist.distributed_c10d._get_default_store(),
                rank=self.rank,
                world_size=self.world_size,
                log=self._collectives,
                stall_s=self.config.stall_s,
            )
            self._watchdog = Watchdog(
                self.layout.stacks,
                rank=self.rank,
                after_s=0.9 * self.config.timeout_s,
                monitor=monitor,
            )

    def _record_settings(self) -> None:
        """Main process: ``run_dir/run.json``, what this run resolved and the settings' ``extra``
        values (rewritten when a setting changes, e.g. grad_accum derived from global_batch)."""
        if not self.topology.is_main:
            return
        path = self.layout.report
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self._settings_record(), indent=1, allow_nan=False) + "\n")
        os.replace(tmp, path)

    def _settings_record(self) -> dict[str, Any]:
        """What ``run.json`` holds, as JSON data (also the trackers' hyper-parameters)."""
        record = {
            "started": self._started,
            "paratrain": __version__,
            "torch": torch.__version__,
            "strategy": self.strategy.name,
            "world_size": self.topology.world_size,
            "device": self.device.type,
            "backend": self.selection.backend if self.strategy.multi_process else None,
            "restart_count": self._env.restart_count,
            "settings": {
                f.name: getattr(self.config, f.name) for f in dataclasses.fields(RunConfig)
            }
            | {"ckpt_storage_options": redacted(self.config.ckpt_storage_options)},
        }
        plain: dict[str, Any] = _plain(record)
        return plain

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
    def data_rank(self) -> int:
        """Which share of the data this rank reads: ``rank`` unless ranks split the model
        (pp, tp), where each pipeline and each tp group shares one."""
        return self.strategy.data_rank

    @property
    def data_size(self) -> int:
        """Into how many shares the data is split: ``world_size`` divided by pp and tp sizes."""
        return self.strategy.data_size

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
        """All-reduce a number, numpy value or tensor over ranks (sum, mean, max, min).

        With pipeline or tensor parallelism the ranks of a pipeline or tp group read the same
        batch: a sum counts each group once, so ``run.reduce(correct, "sum")`` still counts
        every sample once."""
        copies = self.strategy.shape.copies
        return collectives.reduce(value, op, device=self.device, copies=copies)

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
                    name, timeout_s=self.config.timeout_s, group=collectives.gloo_group()
                )
        self._progress()

    def _progress(self) -> None:
        """Tell the hang watchdog this process moved (Run passes its step)."""
        if self._watchdog is not None:
            self._watchdog.progress(self._watchdog.step)

    def print(self, *values: object, **kwargs: Any) -> None:
        """``print`` on the main process only, with print's keywords (``sep``, ``end``,
        ``file``, ``flush``; output is always flushed)."""
        self.console.print(*values, **kwargs)

    def get_logger(self, name: str = "paratrain") -> logging.Logger:
        """A ``logging.Logger`` that emits on the main process only."""
        return self.console.logger(name)

    def log(self, metrics: Mapping[str, float], *, step: int | None = None) -> None:
        """Record scalars (main process): ``run_dir/metrics.jsonl`` and the ``log_to`` trackers."""
        self.console.log(metrics, step=self._default_step() if step is None else step)

    def _default_step(self) -> int:
        return 0

    def save_weights(self, model: nn.Module, path: str | Path) -> Path:
        """Save the full, unprefixed weights to ``path`` (collective; the main process writes)."""
        if not isinstance(model, nn.Module):
            raise ModelError(
                f"save_weights(model=...) takes the torch.nn.Module to save, got "
                f"{type(model).__name__}."
            )
        path = check_output_file(path, "save_weights(path=...)")
        self.strategy.sync_buffers(model)
        state = self.strategy.full_state_dict(model)
        if self.is_main:
            atomic_torch_save(state, path)
        self.barrier()
        return path

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Close logs and destroy the process group this run created. Safe to call twice; a
        run the script never closes is closed at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._collectives is not None:
            self._collectives.uninstall()
        try:
            self._before_close()
        finally:
            if hasattr(self, "console"):
                self.console.close()
            destroy_process_group(self._owns_group)

    def _before_close(self) -> None:
        """What a subclass must finish before the group goes (an asynchronous save)."""

    def __enter__(self) -> RunBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON can hold it: text keys, lists for tuples and sets, finite numbers, paths
    as text, anything else (and anything nested too deep, e.g. a cycle) as its repr."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Path):
        return str(value)
    if depth < 16 and isinstance(value, dict):
        return {
            k if isinstance(k, str) else repr(k): _plain(v, depth + 1) for k, v in value.items()
        }
    if depth < 16 and isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v, depth + 1) for v in value]
    return repr(value)


def _shown(location: str | Path) -> str:
    """A checkpoint location as written in the launcher report: a URL, or an absolute path."""
    return location if isinstance(location, str) else str(location.resolve())
