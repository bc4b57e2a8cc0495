"""fsdp with precision="bf16" on CPU ranks trains a model with BatchNorm (torch's CPU batch norm
wants its running statistics in the input's dtype: paratrain runs norm layers in fp32), and ends
close to one process with the global batch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import paratrain as pt
from tests.support.distributed import run_distributed
from tests.support.training import max_abs_diff

pytestmark = pytest.mark.dist


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
        nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


def _train(strategy: str, batch_size: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(32, 3, 8, 8, generator=generator),
        torch.randint(0, 4, (32,), generator=generator),
    )
    settings: dict[str, Any] = dict(strategy=strategy, precision="bf16", seed=0, progress=False)
    if strategy == "fsdp":
        settings["fsdp_wrap"] = (nn.Sequential,)
    with pt.Run(**settings) as run:
        net = _net()
        model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.05))
        for x, y in run.loader(data, batch_size=batch_size, shuffle=False):
            run.backward(F.cross_entropy(model(x), y))
            run.step(optimizer)
        state = run.strategy.full_state_dict(model) if strategy == "fsdp" else model.state_dict()
        return {"steps": run.global_step, "weights": {k: v.float() for k, v in state.items()}}


def test_fsdp_bf16_trains_batchnorm_on_cpu_ranks() -> None:
    ranks = run_distributed(_train, 2, "fsdp", 4)
    reference = _train("cpu", 8)
    assert ranks[0]["steps"] == reference["steps"] == 4
    weights = {k: v for k, v in ranks[0]["weights"].items() if "num_batches" not in k}
    expected = {k: v for k, v in reference["weights"].items() if "num_batches" not in k}
    assert max_abs_diff(weights, expected) <= 5e-2
