"""What each rank runs: the paratrain loop and the hand-written reference loop, timed per step.

    stats = measure_config(spec, Config("ddp", "bf16", 2), settings)   # inside every rank

The reference is the tutorials' template written out by hand for each strategy (a plain loop,
``nn.DataParallel``, ``DistributedDataParallel``, ``fully_shard``), with ``torch.autocast`` and a
``GradScaler`` for reduced precision. Both loops live in the same process (same model init, same
data) and run in alternating blocks of ``steps`` steps, the order swapped every pair; each pair
of blocks gives one ratio, so the machine's drifts hit both sides of it alike. Pairs are added
until the bootstrap 95 % interval of the median ratio is within ``±spread`` of it (at least
``rounds`` pairs), or until ``budget_s`` is spent: then the result is marked noisy.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import random
import statistics
import time
from collections.abc import Callable, Iterator
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
    budget_s: float = 60.0
    """Seconds of paired blocks per configuration before giving up on ``spread``."""
    spread: float = 0.03
    """Wanted half-width of the median ratio's 95 % interval, relative to the median."""


@dataclass
class Loop:
    """A ready training loop: ``step(x, y)`` on the next of ``batches``."""

    step: Callable[[Any, torch.Tensor], None]
    batches: Iterator[tuple[Any, torch.Tensor]]
    device: torch.device
    close: Callable[[], None]


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


def paratrain_loop(spec: ModelSpec, config: Config, settings: Settings) -> Loop:
    """The paratrain loop for ``config``, set up and ready to step."""
    with contextlib.redirect_stdout(io.StringIO()):
        run = pt.Run(strategy=config.strategy, precision=config.precision, progress=False)
    try:
        torch.manual_seed(0)
        model = spec.build()
        model, optimizer = run.setup(
            model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        )
        loader = None
        if settings.data == "loader":
            with contextlib.redirect_stdout(io.StringIO()):
                loader = run.loader(_dataset(spec, settings), batch_size=settings.batch_size)
    except BaseException:
        run.close()
        raise
    return Loop(
        step=lambda x, y: _paratrain_step(run, model, optimizer, spec, x, y),
        batches=_batches(spec, settings, run.device, loader, run.epochs(2**62)),
        device=run.device,
        close=run.close,
    )


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


def reference_loop(spec: ModelSpec, config: Config, settings: Settings) -> Loop:
    """The hand-written loop for the same strategy and precision, ready to step."""
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

    return Loop(step, _batches(spec, settings, device, loader), device, lambda: None)


def _timed_steps(loop: Loop, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        x, y = next(loop.batches)
        loop.step(x, y)
        _sync(loop.device)
        times.append(time.perf_counter() - start)
    return times


def _agreed(values: list[float]) -> list[float]:
    """``values``, each the maximum over ranks (every rank then decides alike)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return values
    box = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return [float(v) for v in box.tolist()]


def median_interval(ratios: list[float], *, resamples: int = 2000) -> tuple[float, float]:
    """Bootstrap 95 % interval of the median of ``ratios`` (seeded: the same on every rank)."""
    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples)
    )
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def measure_config(spec: ModelSpec, config: Config, settings: Settings) -> dict[str, Any]:
    """Paired blocks of both loops until the ratio is known to ``±spread``; throughput,
    step-time quantiles, memory, the median ratio with its interval, and a noisy flag."""
    device = _device()
    reset_peak_memory(device)
    ours = paratrain_loop(spec, config, settings)
    try:
        _timed_steps(ours, settings.warmup)
        memory = peak_memory_mb(device)  # paratrain's loop alone, before the reference exists
        ref = reference_loop(spec, config, settings)
        _timed_steps(ref, settings.warmup)
        pairs: list[tuple[float, float]] = []
        step_times: list[float] = []
        start = time.perf_counter()
        noisy = False
        while True:
            first, second = (ours, ref) if len(pairs) % 2 == 0 else (ref, ours)
            a = _timed_steps(first, settings.steps)
            b = _timed_steps(second, settings.steps)
            mine, theirs = (a, b) if first is ours else (b, a)
            step_times += mine
            t_ours, t_ref, elapsed = _agreed([sum(mine), sum(theirs), time.perf_counter() - start])
            pairs.append((t_ours, t_ref))
            if len(pairs) < max(2, settings.rounds):
                continue
            ratios = [r / o for o, r in pairs]
            low, high = median_interval(ratios)
            if (high - low) / 2 <= settings.spread * statistics.median(ratios):
                break
            if elapsed >= settings.budget_s or len(pairs) >= _MAX_PAIRS:
                noisy = True
                break
    finally:
        ours.close()
    world = dist.get_world_size() if dist.is_initialized() else 1
    per_step = settings.batch_size * world * settings.steps
    step_times.sort()
    memories = [memory]
    if dist.is_initialized() and world > 1:
        memories = [0.0] * world
        dist.all_gather_object(memories, memory)
    return {
        "samples_per_s": statistics.median(per_step / o for o, _ in pairs),
        "reference_samples_per_s": statistics.median(per_step / r for _, r in pairs),
        "overhead_ratio": statistics.median(ratios),
        "ratio_low": low,
        "ratio_high": high,
        "pairs": len(pairs),
        "noisy": noisy,
        "step_ms_p50": 1000 * step_times[len(step_times) // 2],
        "step_ms_p90": 1000 * step_times[min(len(step_times) - 1, int(len(step_times) * 0.9))],
        "peak_memory_mb": memories,
    }


_MAX_PAIRS = 400
