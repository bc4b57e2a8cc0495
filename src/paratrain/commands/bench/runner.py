"""Plan the benchmark matrix, skip what cannot run here (with the reason), run the rest.

    plan = make_plan(["cpu", "ddp"], ["fp32", "bf16"], [1, 2])
    results = run_plan(plan, model_args, settings, progress=print)

Every rank count is one group of spawned processes (gloo over a file rendezvous on CPU, nccl on
GPUs) that measures all of its configurations; the parent collects rank 0's numbers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from paratrain.commands.bench.loops import Config, Settings
from paratrain.commands.bench.measure import measure_config
from paratrain.commands.bench.models import build_spec
from paratrain.commands.run.preflight import preflight
from paratrain.config import RunConfig
from paratrain.distributed.ranks import FileGroup, RankFailedError, spawn_ranks
from paratrain.errors import ParatrainError
from paratrain.plans.pipeline_stages import plan_stages
from paratrain.plans.tp import auto_plan


def make_plan(
    strategies: list[str],
    precisions: list[str],
    nprocs: list[int],
    model: nn.Module | None = None,
) -> list[tuple[Config, str | None]]:
    """Every configuration with ``None`` or the reason it cannot run on this machine.

    ``model`` (built on the meta device) lets ``tp`` rows be skipped when ``tp_plan='auto'``
    finds nothing to split in it, and ``pipeline`` rows when it cannot be cut into stages."""
    gpus = torch.cuda.device_count()
    plan = []
    for nproc in nprocs:
        for strategy in strategies:
            for precision in precisions:
                config = Config(strategy, precision, nproc)
                plan.append((config, _why_not(config, gpus, model)))
    return plan


def _why_not(config: Config, gpus: int, model: nn.Module | None) -> str | None:
    if config.strategy in ("tp", "fsdp_tp") and model is not None and not auto_plan(model).styles:
        return "tp_plan='auto' finds no Linear pair it can split in this model."
    if config.strategy == "pipeline" and model is not None:
        try:
            plan_stages(model, None, config.nproc)
        except ParatrainError as err:
            return str(err).split(". ")[0] + "."
    try:
        preflight(
            RunConfig(**config.run_settings()),
            nproc=config.nproc,
            gpus=gpus,
        )
    except ParatrainError as err:
        return str(err).split(". ")[0] + "."
    return None


def _measure_group(
    configs: list[Config], model_args: dict[str, Any], settings: Settings
) -> list[tuple[Config, dict[str, Any]]]:
    """One rank of a group (the spawner built the process group); rank 0 returns the rows."""
    spec = build_spec(**model_args)
    rows = []
    for config in configs:
        try:
            result: dict[str, Any] = measure_config(spec, config, settings)
        except ParatrainError as err:
            result = {"error": str(err)}
        rows.append((config, result))
    return rows


def run_group(
    nproc: int, configs: list[Config], model_args: dict[str, Any], settings: Settings
) -> list[tuple[Config, dict[str, Any]]]:
    """Measure ``configs`` on ``nproc`` freshly spawned ranks."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    try:
        values = spawn_ranks(
            _measure_group,
            nproc,
            (configs, model_args, settings),
            start_method="spawn",
            group=FileGroup(backend=backend, timeout_s=300),
            timeout_s=None,  # a large model may take long; a dead rank still ends the group
            threads=settings.threads or max(1, (os.cpu_count() or 1) // nproc),
            results="main",
        )
    except RankFailedError as err:
        print(err, file=sys.stderr, flush=True)
        raise ParatrainError(
            f"A benchmark rank failed with {nproc} ranks (rank {err.rank}; its traceback is "
            "above). Try fewer ranks or a smaller model."
        ) from err
    rows: list[tuple[Config, dict[str, Any]]] = values[0]
    return rows


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
