"""A torch.profiler trace of a few paratrain steps, readable by TensorBoard and Perfetto.

profile_one("cpu", "fp32", {"name": "mlp", "width": 512, "depth": 3}, settings, run_dir)
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

import paratrain as pt
from paratrain.commands.bench.loops import Settings
from paratrain.commands.bench.models import build_spec


def profile_one(
    strategy: str, precision: str, margs: dict[str, Any], settings: Settings, run_dir: Path
) -> Path:
    """Profile 3 steps (after 2 of warm-up) in this process; return the trace folder."""
    out = run_dir / "profile"
    spec = build_spec(**margs)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with contextlib.redirect_stdout(io.StringIO()):
        run = pt.Run(strategy=strategy, precision=precision, progress=False)
    try:
        model = spec.build()
        model, optimizer = run.setup(model, torch.optim.SGD(model.parameters(), lr=1e-3))
        x, y = spec.batch(settings.batch_size, run.device)
        with profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=2, active=3),
            on_trace_ready=tensorboard_trace_handler(str(out)),
        ) as prof:
            for _ in range(5):
                with run.accumulate(model):
                    run.backward(spec.loss(model(x), y))
                run.step(optimizer)
                prof.step()
    finally:
        run.close()
    return out
