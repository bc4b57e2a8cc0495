"""A few steps of a tiny model that log every step and save at one of them.

runs = train(tmp_path / "run", steps=6, save_at=3, log_to=["mlflow"])   # the tracker runs
train(tmp_path / "run", steps=6, resume=True, attempt=2, log_to=["mlflow"])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

import paratrain as pt


def train(
    run_dir: Path,
    *,
    steps: int,
    save_at: int | None = None,
    resume: bool = False,
    attempt: int = 1,
    **settings: Any,
) -> dict[str, dict[str, Any]]:
    """Train to ``steps``, logging ``loss`` and ``attempt`` every step; the tracker runs."""
    settings = {"strategy": "cpu", "progress": False, "stats_every": None, **settings}
    with pt.Run(run_dir=run_dir, **settings) as run:
        torch.manual_seed(0)
        net = nn.Linear(4, 1)
        model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        if resume:
            assert run.resume() is not None
        while run.global_step < steps:
            loss = model(torch.randn(8, 4)).pow(2).mean()
            run.backward(loss)
            run.step(optimizer)
            run.log({"loss": loss.item(), "attempt": attempt})
            if run.global_step == save_at:
                run.save()
        return run.console.trackers.runs
