"""What each rank runs: the paratrain loop and the hand-written reference loop, timed per step.

    stats = measure_config(spec, Config("ddp", "bf16", 2), settings)   # inside every rank

The reference is the tutorials' template written out by hand for each strategy (a plain loop,
``nn.DataParallel``, ``DistributedDataParallel``, ``fully_shard``, ``parallelize_module``,
on 2-D meshes too, ``PipelineStage`` with ``Schedule1F1B``), with ``torch.autocast`` and a
``GradScaler`` for reduced precision. Both loops live in the same process (same model init, same
data) and run in alternating blocks of ``steps`` steps, the order swapped every pair; each pair
of blocks gives one ratio, so the machine's drifts hit both sides of it alike. Pairs are added
until the bootstrap 95 % interval of the median ratio is within ``±spread`` of it (at least
``rounds`` pairs), or until ``budget_s`` is spent: then the result is marked noisy. glibc's
malloc thresholds are fixed first (:func:`steady_allocator`): left adaptive, one loop's frees
made the other's allocations fault in fresh pages every step.

With ``Settings.compare`` (``("accelerate", "fabric")``) the peers' loops join the same rounds:
each round runs every loop for one block, round ``r`` starting at loop ``r % n`` so that every
loop takes every position equally, and each peer gets its own ratio against the same reference
blocks. The stopping rule looks at paratrain's ratio only; a peer's interval is reported as it
came out of those rounds.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import io
import itertools
import random
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

import paratrain as pt
from paratrain.commands.bench.loops import Config, Loop, Settings, bench_dataset, bench_device
from paratrain.commands.bench.models import ModelSpec
from paratrain.profiling.memory import peak_memory_mb, reset_peak_memory

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


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


def paratrain_loop(spec: ModelSpec, config: Config, settings: Settings) -> Loop:
    """The paratrain loop for ``config``, set up and ready to step."""
    with contextlib.redirect_stdout(io.StringIO()):
        run = pt.Run(**config.run_settings(), progress=False)
    try:
        torch.manual_seed(0)
        model = spec.build()
        # The loss inside the model (loss_fn=, model(x, target=y)) only where the strategy needs
        # it (split logits, pipeline stages); elsewhere as the documented loop computes it.
        loss_fn = spec.loss if config.splits_layers else None
        with contextlib.redirect_stdout(io.StringIO()):
            model, optimizer = run.setup(
                model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9), loss_fn=loss_fn
            )
        loader = None
        if settings.data == "loader":
            with contextlib.redirect_stdout(io.StringIO()):
                loader = run.loader(
                    bench_dataset(spec, settings),
                    batch_size=settings.batch_size,
                    drop_last=config.strategy == "pipeline",  # micro-batches of one size
                )
    except BaseException:
        run.close()
        raise
    return Loop(
        step=lambda x, y: _paratrain_step(run, model, optimizer, spec, x, y, loss_fn is None),
        batches=_batches(spec, settings, run.device, loader, run.epochs(2**62)),
        device=run.device,
        close=run.close,
        parameters=lambda: list(model.parameters()),
    )


def _paratrain_step(
    run: pt.Run,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    spec: ModelSpec,
    x: Any,
    y: torch.Tensor,
    outside: bool,
) -> None:
    with run.accumulate(model):
        run.backward(spec.loss(model(x), y) if outside else model(x, target=y))
    run.step(optimizer)


def reference_loop(spec: ModelSpec, config: Config, settings: Settings) -> Loop:
    """The hand-written loop for the same strategy and precision, ready to step."""
    device = bench_device()
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
    elif config.strategy == "tp":  # torch's own API, on the layers tp_plan="auto" picks
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        from paratrain.plans.tp import auto_plan

        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        plan = {name: styles[style]() for name, style in auto_plan(model).styles.items()}
        parallelize_module(model, mesh, plan)
    elif config.strategy == "pipeline":
        return _pipeline_reference(spec, settings, model, device)
    elif config.strategy in ("fsdp_tp", "hsdp"):  # a 2-D mesh: tp or replicas of pairs
        _two_dimensional(config.strategy, model, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type) if config.precision == "fp16" else None
    dtype = _DTYPES.get(config.precision)
    loader = None
    if settings.data == "loader":
        data = bench_dataset(spec, settings)
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

    return Loop(
        step,
        _batches(spec, settings, device, loader),
        device,
        lambda: None,
        lambda: list(model.parameters()),
    )


def _two_dimensional(layout: str, model: nn.Module, device: torch.device) -> None:
    """``fsdp_tp``: ``parallelize_module`` over tp pairs, ``fully_shard`` over the dp axis;
    ``hsdp``: ``fully_shard`` over a (replicate, shard) mesh of pairs. torch's API by hand."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    names = ("dp", "tp") if layout == "fsdp_tp" else ("dp_replicate", "dp")
    mesh = init_device_mesh(device.type, (world // 2, 2), mesh_dim_names=names)
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)
    if layout == "hsdp":
        fully_shard(model, mesh=mesh)
        return
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from paratrain.plans.tp import auto_plan

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {name: styles[style]() for name, style in auto_plan(model).styles.items()}
    parallelize_module(model, mesh["tp"], plan)
    if world > 2:
        fully_shard(model, mesh=mesh["dp"])


def _pipeline_reference(
    spec: ModelSpec, settings: Settings, model: nn.Module, device: torch.device
) -> Loop:
    """torch's pipelining API by hand on the stages paratrain cuts: one ``PipelineStage`` per
    rank, ``Schedule1F1B`` with one micro-batch per stage, inputs to the first stage only."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from paratrain.plans.pipeline_stages import plan_stages, stage_module

    world, rank = dist.get_world_size(), dist.get_rank()
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)
    part = stage_module(model, plan_stages(model, None, world)[rank])
    stage = PipelineStage(part, rank, world, device)
    schedule = Schedule1F1B(stage, n_microbatches=world, loss_fn=spec.loss)
    optimizer = torch.optim.SGD(part.parameters(), lr=1e-3, momentum=0.9)

    def step(x: Any, y: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(x, target=y if rank == world - 1 else None)
        elif rank == world - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
        optimizer.step()

    loader = None
    if settings.data == "loader":  # every stage reads the same batches
        loader = DataLoader(bench_dataset(spec, settings), batch_size=settings.batch_size)
    return Loop(
        step,
        _batches(spec, settings, device, loader),
        device,
        lambda: None,
        lambda: list(part.parameters()),
    )


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
    # nccl reduces device tensors only; gloo takes CPU ones.
    on = bench_device() if dist.get_backend() == "nccl" else torch.device("cpu")
    box = torch.tensor(values, dtype=torch.float64, device=on)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return [float(v) for v in box.tolist()]


def median_interval(ratios: list[float], *, resamples: int = 2000) -> tuple[float, float]:
    """Bootstrap 95 % interval of the median of ``ratios`` (seeded: the same on every rank)."""
    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples)
    )
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def steady_allocator() -> bool:
    """Fix glibc malloc's mmap and trim thresholds in this process (True if it could).

    glibc adapts both to the sizes freed so far. With two training loops in one process, one
    loop's frees moved the thresholds so that the other's tensors came from fresh, zero-filled
    pages on every step: the paratrain loop measured 0.70-0.74 x the reference after the
    reference's first block (1.00 before it), and 0.98-1.00 x with the thresholds fixed. Both
    loops then reuse the heap, as one loop alone does."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl): no such thresholds
        return False
    mmap_threshold, trim_threshold = -3, -1  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD (malloc.h)
    ok = libc.mallopt(mmap_threshold, 32 * 2**20)  # the 64-bit maximum
    return bool(ok and libc.mallopt(trim_threshold, 2**31 - 1))


def measure_config(spec: ModelSpec, config: Config, settings: Settings) -> dict[str, Any]:
    """Rounds of blocks of every loop until paratrain's ratio is known to ``±spread``, within
    ``budget_s`` (warm-up included).

    Returns throughput, step-time quantiles, memory, the layout, the median ratio with its
    interval, a noisy flag (and ``out_of_time`` when the budget ended the rounds before
    ``rounds`` pairs) and, with ``settings.compare``, ``peers``: each peer's throughput and
    ratio.
    """
    steady_allocator()
    started = time.perf_counter()
    device = bench_device()
    layout = memory_format(spec, settings, device)
    if layout == "channels_last":
        spec = _channels_last(spec)
    torch.backends.cudnn.benchmark = layout == "channels_last" and device.type == "cuda"
    reset_peak_memory(device)
    loops = 2 + len(settings.compare)
    with contextlib.ExitStack() as stack:
        ours = paratrain_loop(spec, config, settings)
        stack.callback(ours.close)
        step_s = _warm_up(ours, settings.warmup)
        # The others warm up as long as paratrain's loop did, within a quarter of the budget.
        warmup = max(1, min(settings.warmup, int(settings.budget_s / 4 / loops / step_s)))
        settings = dataclasses.replace(settings, warmup=warmup)
        memory = peak_memory_mb(device)  # paratrain's loop alone, before the reference exists
        ref = reference_loop(spec, config, settings)
        _timed_steps(ref, settings.warmup)
        peers: dict[str, Loop] = {}
        skipped: dict[str, str] = {}
        if settings.compare:
            from paratrain.commands.bench.peers import start_peers

            peers, skipped = start_peers(settings.compare, spec, config, settings, stack)
        every = [ours, ref, *peers.values()]
        if layout == "channels_last":
            for loop in every:
                loop.step = _channels_last_inputs(loop.step)
        steps = block_steps(settings, _agreed([time.perf_counter() - started])[0], step_s, loops)
        settings = dataclasses.replace(settings, steps=steps)
        rounds, step_times, noisy, short = _rounds(every, settings, started)
    world = dist.get_world_size() if dist.is_initialized() else 1
    shared = {"tp": world, "pipeline": world, "fsdp_tp": 2}.get(config.strategy, 1)
    data_ranks = world // shared  # a tp group or a pipeline shares one batch
    per_step = settings.batch_size * data_ranks * settings.steps
    low, high = median_interval([t[1] / t[0] for t in rounds])
    step_times.sort()
    result: dict[str, Any] = {
        "samples_per_s": statistics.median(per_step / t[0] for t in rounds),
        "reference_samples_per_s": statistics.median(per_step / t[1] for t in rounds),
        "overhead_ratio": statistics.median(t[1] / t[0] for t in rounds),
        "ratio_low": low,
        "ratio_high": high,
        "pairs": len(rounds),
        "noisy": noisy,
        "out_of_time": short,
        "block_steps": settings.steps,
        "layout": layout,
        "step_ms_p50": 1000 * step_times[len(step_times) // 2],
        "step_ms_p90": 1000 * step_times[min(len(step_times) - 1, int(len(step_times) * 0.9))],
        "peak_memory_mb": _gathered(memory),
    }
    if settings.compare:
        result["peers"] = {
            name: _peer_stats(rounds, 2 + list(peers).index(name), per_step, settings.spread)
            if name in peers
            else {"skipped": skipped[name]}
            for name in settings.compare
        }
    return result


def _rounds(
    loops: list[Loop], settings: Settings, start: float
) -> tuple[list[list[float]], list[float], bool, bool]:
    """Block times per round (one per loop, the maximum over ranks), loop 0's step times,
    whether the ratio of loop 1 to loop 0 was not known to ``±spread`` when the rounds ended,
    and whether the budget (counted from ``start``) ended them before ``settings.rounds``
    pairs. Two rounds at least.

    Round ``r`` runs the loops starting at index ``r % len(loops)``.
    """
    rounds: list[list[float]] = []
    step_times: list[float] = []
    while True:
        times = [0.0] * len(loops)
        for k in range(len(loops)):
            i = (len(rounds) + k) % len(loops)
            block = _timed_steps(loops[i], settings.steps)
            times[i] = sum(block)
            if i == 0:
                step_times += block
        *agreed, elapsed = _agreed([*times, time.perf_counter() - start])
        rounds.append(agreed)
        if len(rounds) < 2:
            continue
        ratios = [t[1] / t[0] for t in rounds]
        low, high = median_interval(ratios)
        narrow = (high - low) / 2 <= settings.spread * statistics.median(ratios)
        enough = len(rounds) >= settings.rounds
        if narrow and enough:
            return rounds, step_times, False, False
        if elapsed >= settings.budget_s or len(rounds) >= _MAX_PAIRS:
            return rounds, step_times, not narrow, not enough


def _warm_up(loop: Loop, steps: int) -> float:
    """Run up to ``steps`` warm-up steps of ``loop``; the step time (the slowest rank's) after
    the first, which allocates and picks kernels. Every rank runs the same number."""
    _timed_steps(loop, 1)
    if steps <= 1:
        return _agreed([max(_timed_steps(loop, 1)[0], 1e-6)])[0]
    probe = _agreed([statistics.median(_timed_steps(loop, min(3, steps - 1)))])[0]
    return _agreed([statistics.median([probe, *_timed_steps(loop, max(0, steps - 4))])])[0]


def block_steps(settings: Settings, elapsed_s: float, step_s: float, loops: int) -> int:
    """Steps per timed block: ``settings.steps``, or fewer so that ``settings.rounds`` rounds
    of ``loops`` blocks fit in what is left of the budget (one at least).

    block_steps(Settings(32, 20, 10, 8, "synthetic", budget_s=60), 10.0, 1.5, 2)   # 2
    """
    left = max(settings.budget_s - elapsed_s, 0.0)
    fit = int(left / (max(settings.rounds, 2) * loops * max(step_s, 1e-9)))
    return max(1, min(settings.steps, fit))


def memory_format(spec: ModelSpec, settings: Settings, device: torch.device) -> str:
    """``channels_last`` or ``contiguous``: as asked, or (``auto``) channels_last for a model
    with 2-D convolutions on a GPU."""
    if settings.memory_format != "auto":
        return settings.memory_format
    with torch.device("meta"):
        model = spec.build()
    convolutional = any(isinstance(m, nn.Conv2d) for m in model.modules())
    return "channels_last" if convolutional and device.type == "cuda" else "contiguous"


def _channels_last(spec: ModelSpec) -> ModelSpec:
    """``spec`` whose models are built in channels_last."""
    build = spec.build

    def channels_last() -> nn.Module:
        model: nn.Module = build().to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        return model

    return dataclasses.replace(spec, build=channels_last)


def _channels_last_inputs(step: Any) -> Any:
    """``step`` fed 4-D inputs in channels_last, as the tutorials' loops convert them."""

    def converted(x: Any, y: torch.Tensor) -> None:
        if isinstance(x, torch.Tensor) and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        step(x, y)

    return converted


def _peer_stats(
    rounds: list[list[float]], index: int, per_step: int, spread: float
) -> dict[str, Any]:
    """A peer's throughput and its ratio to the reference (reference time ÷ peer time)."""
    ratios = [t[1] / t[index] for t in rounds]
    median = statistics.median(ratios)
    low, high = median_interval(ratios)
    return {
        "samples_per_s": statistics.median(per_step / t[index] for t in rounds),
        "ratio": median,
        "ratio_low": low,
        "ratio_high": high,
        "noisy": (high - low) / 2 > spread * median,
    }


def _gathered(memory: float) -> list[float]:
    """``memory`` of every rank, in rank order."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [memory]
    memories: list[float] = [0.0] * dist.get_world_size()
    dist.all_gather_object(memories, memory)
    return memories


_MAX_PAIRS = 400
