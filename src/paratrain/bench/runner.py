"""Plan the benchmark matrix, skip what cannot run here (with the reason), run the rest.

    plan = make_plan(["cpu", "ddp"], ["fp32", "bf16"], [1, 2])
    results = run_plan(plan, model_args, settings, progress=print)

Every rank count is one group of spawned processes (gloo over a file rendezvous on CPU, nccl on
GPUs) that measures all of its configurations; the parent collects rank 0's numbers.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from paratrain.bench.measure import Config, Settings, measure_config
from paratrain.bench.models import build_spec
from paratrain.config import RunConfig
from paratrain.errors import ParatrainError
from paratrain.precision import Precision
from paratrain.strategies import select_strategy
from paratrain.topology import Topology


def make_plan(
    strategies: list[str], precisions: list[str], nprocs: list[int]
) -> list[tuple[Config, str | None]]:
    """Every configuration with ``None`` or the reason it cannot run on this machine."""
    gpus = torch.cuda.device_count()
    plan = []
    for nproc in nprocs:
        for strategy in strategies:
            for precision in precisions:
                config = Config(strategy, precision, nproc)
                plan.append((config, _why_not(config, gpus)))
    return plan


def _why_not(config: Config, gpus: int) -> str | None:
    topology = Topology(
        rank=0,
        local_rank=0,
        world_size=config.nproc,
        local_world_size=config.nproc,
        master_addr="127.0.0.1",
        master_port=0,
        source="torchrun" if config.nproc > 1 else "none",
    )
    try:
        run_config = RunConfig(strategy=config.strategy, precision=config.precision)
        selection = select_strategy(run_config, topology, gpus)
        Precision(config.precision, selection.strategy.device)
    except ParatrainError as err:
        return str(err).split(". ")[0] + "."
    return None


def _rank(
    rank: int,
    world: int,
    init: str,
    configs: list[Config],
    model_args: dict[str, Any],
    settings: Settings,
    out: Any,
) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        backend,
        init_method=f"file://{init}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(minutes=5),
    )
    try:
        spec = build_spec(**model_args)
        for config in configs:
            try:
                result: dict[str, Any] = measure_config(spec, config, settings)
            except ParatrainError as err:
                result = {"error": str(err)}
            if rank == 0:
                out.put((config, result))
    finally:
        dist.destroy_process_group()


def run_group(
    nproc: int, configs: list[Config], model_args: dict[str, Any], settings: Settings
) -> list[tuple[Config, dict[str, Any]]]:
    """Measure ``configs`` on ``nproc`` freshly spawned ranks."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        procs = [
            ctx.Process(target=_rank, args=(r, nproc, init, configs, model_args, settings, out))
            for r in range(nproc)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    results = []
    while not out.empty():
        results.append(out.get())
    failed = [p.exitcode for p in procs if p.exitcode]
    if failed and len(results) < len(configs):
        raise ParatrainError(
            f"A benchmark rank failed (exit codes {failed}) with {nproc} "
            "ranks; its traceback is above. Try fewer ranks or a smaller model."
        )
    return results


def run_plan(
    plan: list[tuple[Config, str | None]],
    model_args: dict[str, Any],
    settings: Settings,
    progress: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Results for every planned configuration (skipped ones carry their reason)."""
    rows: dict[Config, dict[str, Any]] = {c: {"skipped": why} for c, why in plan if why}
    groups: dict[int, list[Config]] = {}
    for config, why in plan:
        if why is None:
            groups.setdefault(config.nproc, []).append(config)
    for i, (nproc, configs) in enumerate(sorted(groups.items()), 1):
        names = ", ".join(f"{c.strategy}/{c.precision}" for c in configs)
        progress(f"[{i}/{len(groups)}] {nproc} rank(s): {names}")
        for config, result in run_group(nproc, configs, model_args, settings):
            rows[config] = result
    out = []
    for config, _ in plan:
        row = {
            "strategy": config.strategy,
            "precision": config.precision,
            "nproc": config.nproc,
            **rows.get(config, {"skipped": "no result"}),
        }
        out.append(row)
    _scaling(out)
    return out


def _scaling(rows: list[dict[str, Any]]) -> None:
    """Throughput at N ranks ÷ (N × throughput of the same strategy/precision at 1 rank)."""
    base = {
        (r["strategy"], r["precision"]): r["samples_per_s"]
        for r in rows
        if r["nproc"] == 1 and "samples_per_s" in r
    }
    for row in rows:
        one = base.get((row["strategy"], row["precision"]))
        if "samples_per_s" in row and one:
            row["scaling_efficiency"] = row["samples_per_s"] / (row["nproc"] * one)
