"""Strategy registry: the one place a strategy name is branched on.

    selection = select_strategy(config, Topology.from_env())
    model = selection.strategy.wrap(model)

``auto`` picks ``pipeline`` when ``mesh`` has a pp axis or a ``pipeline_*`` setting is given,
``tp`` when ``mesh`` has a tp axis or a ``tp_plan`` is given, ``fsdp`` for a
``mesh`` of data axes, ``ddp`` when several ranks were launched, ``single`` with one visible GPU,
``cpu`` otherwise, and says why.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from paratrain.config import STRATEGY_NAMES, RunConfig
from paratrain.distributed.topology import Topology
from paratrain.errors import ConfigError
from paratrain.strategies.base import Strategy, require_cuda
from paratrain.strategies.single import visible_gpu_label

# name -> (module, class). Modules load on first use: torch.distributed.fsdp alone takes about a
# second to import, which every CLI command (doctor included) would otherwise pay.
REGISTRY: dict[str, tuple[str, str]] = {
    "cpu": ("paratrain.strategies.cpu", "CPUStrategy"),
    "single": ("paratrain.strategies.single", "SingleDeviceStrategy"),
    "dp": ("paratrain.strategies.dp", "DataParallelStrategy"),
    "ddp": ("paratrain.strategies.ddp", "DDPStrategy"),
    "fsdp": ("paratrain.strategies.fsdp", "FSDPStrategy"),
    "tp": ("paratrain.strategies.tp", "TensorParallelStrategy"),
    "pipeline": ("paratrain.strategies.pipeline", "PipelineStrategy"),
}
assert tuple(REGISTRY) == STRATEGY_NAMES, "config.STRATEGY_NAMES and REGISTRY must agree"

__all__ = [
    "REGISTRY",
    "STRATEGY_NAMES",
    "Selection",
    "Strategy",
    "resolve_accelerator",
    "select_strategy",
    "strategy_class",
]


def strategy_class(name: str) -> type[Strategy]:
    """The class registered under ``name``."""
    module, attr = REGISTRY[name]
    cls: type[Strategy] = getattr(importlib.import_module(module), attr)
    return cls


def resolve_accelerator(config: RunConfig, gpus: int) -> str:
    """``cpu`` or ``cuda``; ``cuda`` asked on a machine without GPUs is an error, and so is
    ``cuda`` with strategy ``cpu`` (which trains on the CPU wherever GPUs are visible)."""
    if config.strategy == "cpu":
        if config.accelerator == "cuda":
            raise ConfigError(
                "strategy='cpu' trains on the CPU, but accelerator='cuda' was asked for. Use "
                "strategy='single' (one GPU) or 'auto', or drop accelerator='cuda'."
            )
        return "cpu"
    if config.accelerator == "auto":
        return "cuda" if gpus > 0 else "cpu"
    if config.accelerator == "cuda" and gpus == 0:
        require_cuda("accelerator='cuda'", "none")
    return config.accelerator


def _auto(config: RunConfig, topology: Topology, accelerator: str, gpus: int) -> tuple[str, str]:
    pipelined = {o for o, unused in _OPTIONS_OF["pipeline"].items() if getattr(config, o) != unused}
    if (config.mesh or {}).get("pp", 1) != 1 or pipelined:
        given = f"pipeline settings ({', '.join(sorted(pipelined))})" if pipelined else "a pp axis"
        return "pipeline", f"{given} given"
    if config.tp_plan is not None or (config.mesh or {}).get("tp", 1) != 1:
        return "tp", "tp_plan or a tp axis in mesh was given"
    if config.mesh is not None:
        return "fsdp", "mesh was given"
    if topology.world_size > 1:
        return "ddp", f"{topology.world_size} ranks were launched ({topology.source} variables)"
    if accelerator == "cuda":
        hint = (
            f"; {gpus} GPUs are visible: `paratrain run --nproc {gpus}` trains on all of them"
            if gpus > 1
            else ""
        )
        return "single", f"one process and a GPU ({visible_gpu_label(0)}){hint}"
    return "cpu", "one process and no GPU visible"


@dataclass(frozen=True, slots=True)
class Selection:
    """What :func:`select_strategy` decided for this process."""

    strategy: Strategy
    reason: str
    """Why this strategy (``"asked for"`` unless ``auto`` picked it)."""
    backend: str
    """Collective backend for the process group: ``nccl`` or ``gloo``."""
    notes: list[str]
    """Warnings about the settings (options that the chosen strategy ignores)."""


def select_strategy(config: RunConfig, topology: Topology, gpus: int | None = None) -> Selection:
    """Build the strategy for this process and say why it was chosen."""
    gpus = torch.cuda.device_count() if gpus is None else gpus
    accelerator = resolve_accelerator(config, gpus)
    backend = config.backend or ("nccl" if accelerator == "cuda" else "gloo")
    if backend == "nccl":
        require_cuda("backend 'nccl'", accelerator)
    if config.comm_hook == "bf16" and backend != "nccl":
        raise ConfigError(
            f"comm_hook='bf16' needs the nccl backend (CUDA GPUs); this run uses {backend!r}, "
            "whose all-reduce cannot compress to bf16. Use comm_hook='fp16', or drop comm_hook."
        )
    if config.strategy == "auto":
        name, reason = _auto(config, topology, accelerator, gpus)
    else:
        name, reason = config.strategy, "asked for"
    cls = strategy_class(name)
    cls.check(config, topology, accelerator, gpus)
    notes = _foreign_options(config, name)
    device = cls.device_for(topology, accelerator, config)
    strategy = cls(config=config, topology=topology, device=device)
    return Selection(strategy=strategy, reason=reason, backend=backend, notes=notes)


# Settings that only one strategy reads, with the value that means "not used".
_OPTIONS_OF: dict[str, dict[str, object]] = {
    "ddp": {
        "comm_hook": None,
        "find_unused_parameters": False,
        "static_graph": False,
        "powersgd_rank": 1,
        "powersgd_warmup": 10,
        "broadcast_buffers": True,
    },
    "fsdp": {
        "fsdp_wrap": (),
        "fsdp_reshard_after_forward": True,
        "fsdp_offload": False,
        "mesh": None,
    },
    "tp": {"tp_plan": None},
    "pipeline": {
        "pipeline_split": None,
        "pipeline_schedule": "1f1b",
        "pipeline_stages": None,
        "n_microbatches": None,
    },
    "dp": {"device_ids": None},
}
# Strategies that also read another's options: tp and pipeline shard over the data axes as fsdp
# does, and pipeline splits layers inside its stages as tp does.
_ALSO_READS = {"tp": ("fsdp",), "pipeline": ("fsdp", "tp")}


def _foreign_options(config: RunConfig, chosen: str) -> list[str]:
    """Options of another strategy that were set: an error when the strategy was named, a
    note when ``auto`` chose (the same script may run under another launch)."""
    notes = []
    for owner, options in _OPTIONS_OF.items():
        for option, unused in options.items():
            readers = (owner, *(s for s, also in _ALSO_READS.items() if owner in also))
            if chosen not in readers and getattr(config, option) != unused:
                names = repr(readers[-1])
                if len(readers) > 1:
                    names = ", ".join(repr(r) for r in readers[:-1]) + f" or {names}"
                message = (
                    f"{option} is a {names} option, but the strategy is {chosen!r}, which "
                    f"ignores it. Drop {option}, or use strategy={readers[0]!r}."
                )
                if config.strategy != "auto":
                    raise ConfigError(message)
                notes.append(message)
    return notes
