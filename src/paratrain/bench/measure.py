"""What each rank runs: the paratrain loop and the hand-written reference loop, timed per step.

    stats = measure_config(spec, Config("ddp", "bf16", 2), settings)   # inside every rank

The reference is the tutorials' template written out by hand for each strategy (a plain loop,
``nn.DataParallel``, ``DistributedDataParallel``, ``fully_shard``), with ``torch.autocast`` and a
``GradScaler`` for reduced precision. Both loops run alternately for ``rounds`` rounds so slow
drifts in machine load cancel in their ratio.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import paratrain as pt
from paratrain.bench.models import ModelSpec
from paratrain.memory import peak_memory_mb, reset_peak_memory

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Config:
    """One cell of the benchmark matrix."""

    strategy: str
    precision: str
    nproc: int


@dataclass(frozen=True)
class Settings:
    """What every configuration shares."""

    batch_size: int
    steps: int
    warmup: int
    rounds: int
    data: str
    """``synthetic`` (one batch kept on the device) or ``loader`` (a DataLoader every step)."""


def _device() -> torch.device:
    if torch.cuda.is_available():
        rank = dist.get_rank() if dist.is_initialized() else 0
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _batches(
    spec: ModelSpec,
    settings: Settings,
    device: torch.device,
    loader: Any,
    epochs: Iterator[int] | None = None,
) -> Iterator[tuple[Any, torch.Tensor]]:
    """Endless batches: one fixed batch, or the loader's passes, one per epoch."""
    if loader is None:
        fixed = spec.batch(settings.batch_size, device)
        return itertools.repeat(fixed)
    passes = (loader for _ in epochs) if epochs is not None else itertools.repeat(loader)
    return (
        tuple(t.to(device, non_blocking=True) for t in b)
        for b in itertools.chain.from_iterable(passes)
    )


def _dataset(spec: ModelSpec, settings: Settings) -> TensorDataset:
    world = dist.get_world_size() if dist.is_initialized() else 1
    x, y = spec.batch(settings.batch_size * world * 8, torch.device("cpu"))
    return TensorDataset(x, y)


def paratrain_loop(spec: ModelSpec, config: Config, settings: Settings) -> list[float]:
    """Per-step seconds of the paratrain loop (after warmup)."""
    with contextlib.redirect_stdout(io.StringIO()):
        run = pt.Run(strategy=config.strategy, precision=config.precision, progress=False)
    try:
        model = spec.build()
        model, optimizer = run.setup(
            model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        )
        loader = None
        if settings.data == "loader":
            with contextlib.redirect_stdout(io.StringIO()):
                loader = run.loader(_dataset(spec, settings), batch_size=settings.batch_size)
        batches = _batches(spec, settings, run.device, loader, run.epochs(2**62))
        return _timed_steps(
            settings,
            run.device,
            batches,
            lambda x, y: _paratrain_step(run, model, optimizer, spec, x, y),
        )
    finally:
        run.close()


def _paratrain_step(
    run: pt.Run,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    spec: ModelSpec,
    x: Any,
    y: torch.Tensor,
) -> None:
    with run.accumulate(model):
        run.backward(spec.loss(model(x), y))
    run.step(optimizer)


def reference_loop(spec: ModelSpec, config: Config, settings: Settings) -> list[float]:
    """Per-step seconds of the hand-written loop for the same strategy and precision."""
    device = _device()
    torch.manual_seed(0)
    model: nn.Module = spec.build().to(device)
    if config.strategy == "dp":
        model = nn.DataParallel(model)
    elif config.strategy == "ddp":
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    elif config.strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type) if config.precision == "fp16" else None
    dtype = _DTYPES.get(config.precision)
    loader = None
    if settings.data == "loader":
        data = _dataset(spec, settings)
        sampler: DistributedSampler[Any] | None = (
            DistributedSampler(data) if dist.is_initialized() else None
        )
        loader = DataLoader(
            data,
            batch_size=settings.batch_size,
            sampler=sampler,
            shuffle=sampler is None,
            pin_memory=device.type == "cuda",
        )

    def step(x: Any, y: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = spec.loss(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()

    return _timed_steps(settings, device, _batches(spec, settings, device, loader), step)


def _timed_steps(
    settings: Settings, device: torch.device, batches: Iterator[tuple[Any, torch.Tensor]], step: Any
) -> list[float]:
    times = []
    for i in range(settings.warmup + settings.steps):
        if i == settings.warmup:
            reset_peak_memory(device)
        start = time.perf_counter()
        x, y = next(batches)
        step(x, y)
        _sync(device)
        if i >= settings.warmup:
            times.append(time.perf_counter() - start)
    return times


def measure_config(spec: ModelSpec, config: Config, settings: Settings) -> dict[str, Any]:
    """Both loops, alternating, ``rounds`` times; throughput, step-time quantiles, memory."""
    device = _device()
    ours: list[list[float]] = []
    refs: list[list[float]] = []
    memory = 0.0
    for r in range(settings.rounds):
        order = [("ours", paratrain_loop), ("ref", reference_loop)]
        for name, loop in order if r % 2 == 0 else order[::-1]:
            times = loop(spec, config, settings)
            if name == "ours":
                ours.append(times)
                memory = max(memory, peak_memory_mb(device))
            else:
                refs.append(times)
    world = dist.get_world_size() if dist.is_initialized() else 1
    per_step = settings.batch_size * world
    all_ours = sorted(t for times in ours for t in times)
    ratios = [sum(b) / sum(a) for a, b in zip(ours, refs, strict=True)]
    memories = [memory]
    if dist.is_initialized() and world > 1:
        memories = [0.0] * world
        dist.all_gather_object(memories, memory)
    return {
        "samples_per_s": statistics.median(per_step * len(t) / sum(t) for t in ours),
        "reference_samples_per_s": statistics.median(per_step * len(t) / sum(t) for t in refs),
        "overhead_ratio": statistics.median(ratios),
        "step_ms_p50": 1000 * all_ours[len(all_ours) // 2],
        "step_ms_p90": 1000 * all_ours[min(len(all_ours) - 1, int(len(all_ours) * 0.9))],
        "peak_memory_mb": memories,
    }
