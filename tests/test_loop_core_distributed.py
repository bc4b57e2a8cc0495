"""The loop core at 2 gloo ranks: a sharded (FSDP, DCP) save before an optimizer's first step
creates no state and resumes as such, as does a parameter that never got a gradient; per-rank
extras resume per rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import paratrain as pt
from tests.support.distributed import run_distributed

pytestmark = pytest.mark.dist


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _two_models(run: pt.Run) -> tuple[Any, Any, Any, Any]:
    a, b = _net(0), _net(1)
    a, opt_a = run.setup(a, torch.optim.Adam(a.parameters(), lr=0.1), name="a")
    b, opt_b = run.setup(b, torch.optim.Adam(b.parameters(), lr=0.1), name="b")
    return a, opt_a, b, opt_b


def _scenario(run_dir: str) -> dict[str, Any]:
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(5))
    out: dict[str, Any] = {}
    with pt.Run(strategy="fsdp", run_dir=run_dir, progress=False, timeout_s=40) as run:
        a, opt_a, _b, opt_b = _two_models(run)
        run.save(extras={"rank": run.rank})  # nothing stepped yet
        out["state_after_save"] = (len(opt_a.state), len(opt_b.state))
        run.backward(a(x).square().mean())
        run.step(opt_a)
        run.save(extras={"rank": run.rank})  # a stepped, b not
    with pt.Run(strategy="fsdp", run_dir=run_dir, progress=False, timeout_s=40) as run:
        a, opt_a, _b, opt_b = _two_models(run)
        extras = run.resume()
        out["resumed"] = (len(opt_a.state), len(opt_b.state), extras)
        out["steps"] = sorted(float(s["step"]) for s in opt_a.state.values())
    for attempt in range(2):  # a parameter that never gets a gradient has no state to resume
        with pt.Run(strategy="fsdp", run_dir=f"{run_dir}/unused", progress=False) as run:
            torch.manual_seed(0)
            net = _WithUnused()
            model, opt = run.setup(net, torch.optim.Adam(net.parameters(), lr=0.1))
            if attempt:
                run.resume()
                out["unused"] = len(opt.state)
            else:
                run.backward(model(x).square().mean())
                run.step(opt)
                run.save()
    return out


class _WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def test_fsdp_save_before_a_first_step_and_per_rank_extras(tmp_path: Path) -> None:
    results = run_distributed(_scenario, 2, str(tmp_path))
    for rank, result in enumerate(results):
        assert result["state_after_save"] == (0, 0)
        assert result["resumed"] == (4, 0, {"rank": rank})
        assert result["steps"] == [1.0] * 4
        assert result["unused"] == 2  # the used layer's weight and bias
