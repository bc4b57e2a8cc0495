"""``dp``: torch.nn.DataParallel — one process, the batch split over several GPUs.

DataParallel gathers outputs and gradients on the first GPU, so that GPU runs out of memory first
and the others wait for it. It is kept for quick experiments; ``paratrain run --nproc N`` with
``ddp`` is faster and balanced, and :meth:`wrap` says so once.
"""

from __future__ import annotations

import warnings
from typing import ClassVar

import torch
from torch import nn

from paratrain.config import RunConfig
from paratrain.distributed.topology import Topology
from paratrain.errors import EnvironmentMismatchError
from paratrain.strategies.base import ForwardsAttributes, Strategy


class DataParallelModule(ForwardsAttributes, nn.DataParallel):  # type: ignore[type-arg]
    """DataParallel that answers the wrapped module's own attributes and methods."""


class DataParallelStrategy(Strategy):
    """Replicate the model on ``device_ids`` each forward; gradients summed on the first GPU."""

    name: ClassVar[str] = "dp"
    needs_cuda: ClassVar[bool] = True

    @classmethod
    def check(cls, config: RunConfig, topology: Topology, accelerator: str, gpus: int) -> None:
        super().check(config, topology, accelerator, gpus)
        bad = [i for i in (config.device_ids or []) if not 0 <= i < gpus]
        if bad:
            raise EnvironmentMismatchError(
                f"device_ids {config.device_ids} name GPUs {bad}, but only {gpus} are visible "
                f"(cuda:0..cuda:{gpus - 1}). Pass device_ids within that range or leave it unset."
            )

    @classmethod
    def device_for(cls, topology: Topology, accelerator: str, config: RunConfig) -> torch.device:
        first = config.device_ids[0] if config.device_ids else 0
        return torch.device("cuda", first)

    def wrap(self, model: nn.Module) -> nn.Module:
        ids = self.config.device_ids or list(range(torch.cuda.device_count()))
        warnings.warn(
            f"DataParallel over GPUs {ids}: outputs and gradients are gathered on cuda:{ids[0]}, "
            "which uses more memory and becomes the bottleneck. For balanced, faster training use "
            f"`paratrain run --nproc {len(ids)} train.py` with strategy='ddp'.",
            stacklevel=3,
        )
        return DataParallelModule(model.to(self.device), device_ids=ids, output_device=ids[0])

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, nn.DataParallel) else model
