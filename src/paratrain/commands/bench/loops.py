"""What every benchmarked loop shares: the matrix cell, the settings, a ready loop, its device
and its data.

    loop = Loop(step=..., batches=..., device=bench_device(), close=...)
    loader = DataLoader(bench_dataset(spec, settings), batch_size=settings.batch_size)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from paratrain.commands.bench.models import ModelSpec

LAYOUTS: dict[str, dict[str, Any]] = {
    "fsdp_tp": {"strategy": "tp", "mesh": {"dp": -1, "tp": 2}, "tp_plan": "auto"},
    "hsdp": {"strategy": "fsdp", "mesh": {"dp_replicate": -1, "dp": 2}},
}
"""Two-dimensional rows of ``--strategies``: FSDP x TP (tp pairs) and HSDP (shard pairs)."""


@dataclass(frozen=True)
class Config:
    """One cell of the benchmark matrix (``strategy``: a strategy name or a LAYOUTS key)."""

    strategy: str
    precision: str
    nproc: int

    def run_settings(self) -> dict[str, Any]:
        """The ``pt.Run`` settings of this cell."""
        settings: dict[str, Any] = dict(LAYOUTS.get(self.strategy, {"strategy": self.strategy}))
        if self.strategy == "tp":
            settings["tp_plan"] = "auto"
        return {**settings, "precision": self.precision}

    @property
    def splits_layers(self) -> bool:
        """True when a group of ranks shares one batch and splits layers (tp, pipeline)."""
        return self.strategy in ("tp", "fsdp_tp", "pipeline")


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
    compare: tuple[str, ...] = ()
    """Peers measured in the same rounds: ``accelerate``, ``fabric`` (see ``bench.peers``)."""
    threads: int | None = None
    """torch threads per rank (None: the cores divided among the ranks)."""
    epoch_batches: int = 8
    """Batches per rank in one pass over the dataset of ``--data loader``."""
    memory_format: str = "auto"
    """``channels_last`` (with ``cudnn.benchmark``), ``contiguous``, or ``auto``: channels_last
    for convolutional models on a GPU, as the tutorials recommend, contiguous otherwise."""


@dataclass
class Loop:
    """A ready training loop: ``step(x, y)`` on the next of ``batches``."""

    step: Callable[[Any, torch.Tensor], None]
    batches: Iterator[tuple[Any, torch.Tensor]]
    device: torch.device
    close: Callable[[], None]
    parameters: Callable[[], list[torch.Tensor]] = field(default=list)
    """The model's parameters in module order (for checking that loops trained alike)."""


def bench_device() -> torch.device:
    """This rank's GPU (by rank, round robin) or the CPU."""
    if torch.cuda.is_available():
        rank = dist.get_rank() if dist.is_initialized() else 0
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def bench_dataset(spec: ModelSpec, settings: Settings) -> TensorDataset:
    """``settings.epoch_batches`` global batches of the model's synthetic data, for loops that
    use a DataLoader."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    x, y = spec.batch(settings.batch_size * world * settings.epoch_batches, torch.device("cpu"))
    return TensorDataset(x, y)
