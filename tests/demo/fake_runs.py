"""Demo run dirs written by hand: the ``metrics.jsonl`` and ``model.pt`` a training leaves."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from paratrain.commands.demo.artefacts import DemoFiles
from paratrain.commands.demo.records import STEP_LOSS

STEPS_PER_EPOCH = 4


def loss_at(step: int) -> float:
    """A loss that differs at every step, with all the digits a float has."""
    return 2.0 / (step + 0.123456789)


def write_run(
    root: Path,
    *,
    attempts: Sequence[range],
    epochs: int,
    train_s: float = 0.25,
    start: float = 1000.0,
    losses: dict[int, float] | None = None,
    weights: dict[str, torch.Tensor] | None = None,
) -> DemoFiles:
    """A run of ``epochs`` epochs whose attempts ran the given steps (counted from 1), one
    second apart; epoch records follow the last step of each epoch the attempt finished, and
    each attempt after the first resumed from the step before its first one."""
    files = DemoFiles(root)
    root.mkdir(parents=True, exist_ok=True)
    changed = losses or {}
    lines, restarts, now = [], [], start
    for attempt, steps in enumerate(attempts):
        if attempt:  # pt.Run's line when the restarted attempt resumed, before its first step
            now += 0.5
            restarts.append({"time": now, "restart": attempt, "step": steps.start - 1})
        for step in steps:
            now += 1.0
            loss = changed.get(step, loss_at(step))
            lines.append({"step": step, "time": now, STEP_LOSS: loss})
            if step % STEPS_PER_EPOCH == 0 and step // STEPS_PER_EPOCH <= epochs:
                epoch = step // STEPS_PER_EPOCH - 1
                lines.append(
                    {"step": step, "time": now, "train/loss": 1.0 / (epoch + 1)}
                    | {"test/accuracy": 0.5 + 0.05 * epoch, "epoch": epoch}
                    | {"time/train_s": train_s}
                )
    files.metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    if restarts:
        files.restarts.write_text("".join(json.dumps(line) + "\n" for line in restarts))
    state = weights if weights is not None else {"w": torch.arange(6.0).reshape(2, 3)}
    torch.save(state, files.weights)
    return files
