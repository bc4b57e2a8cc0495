"""Read what the demo's training logged: epochs, step losses, torchrun attempts.

    records = read_records(files.metrics, files.restarts)
    records.epochs[-1].accuracy       # the last epoch's test accuracy
    records.train_seconds             # the epochs' training passes, timed inside the ranks
    records.attempts                  # [{step: loss}, ...], one dict per torchrun attempt
    records.resumed_at                # [138]: the step each restart resumed from

``metrics.jsonl`` holds what ``run.log`` wrote, ``restarts.jsonl`` a line per torchrun restart
(``pt.Run`` writes it when it resumes), both with the time of writing: a step logged after a
restart's line belongs to the attempt that restart began. Imports no torch.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

STEP_LOSS = "train/step_loss"
"""The key of the main process's loss at each optimizer step (the mean over its micro-batches)."""


@dataclass(frozen=True, slots=True)
class EpochRecord:
    """One epoch's summary line."""

    epoch: int
    """Counted from 1."""
    loss: float
    """Mean training loss over the epoch's batches and the ranks."""
    accuracy: float
    """Test accuracy, each held-out sample evaluated once."""
    train_s: float
    """Seconds of the epoch's training pass, measured on the main process."""


@dataclass(slots=True)
class TrainingRecords:
    """Everything ``metrics.jsonl`` says about one demo training."""

    epochs: list[EpochRecord] = field(default_factory=list)
    """Each epoch once, in order (an epoch logged again after a restart: the later line)."""
    attempts: list[dict[int, float]] = field(default_factory=list)
    """Per torchrun attempt, the main process's loss at each step it ran."""
    train_seconds: float = 0.0
    """The training passes of every epoch that ended, in every attempt."""
    spans: list[tuple[float, float]] = field(default_factory=list)
    """Per attempt, the wall-clock time (``time.time()``) of its first and its last step."""
    resumed_at: list[int] = field(default_factory=list)
    """Per torchrun restart, the step of the checkpoint it resumed from."""

    def redone_steps(self) -> list[int]:
        """Steps that a restarted attempt ran again (the first attempt got past them)."""
        if len(self.attempts) < 2:
            return []
        return sorted(set(self.attempts[0]) & set(self.attempts[1]))

    def final_losses(self) -> dict[int, float]:
        """Each step's loss as the run ended up with it: the last attempt that ran it."""
        merged: dict[int, float] = {}
        for attempt in self.attempts:
            merged.update(attempt)
        return merged


def read_records(metrics: Path, restarts: Path | None = None) -> TrainingRecords:
    """Parse the demo's ``metrics.jsonl`` (lines that are not the demo's are skipped), split
    into attempts at the restarts that ``restarts`` (``restarts.jsonl``) records, if any."""
    records = TrainingRecords()
    restarted = _lines(restarts) if restarts is not None and restarts.is_file() else []
    starts = [float(r["time"]) for r in restarted]
    records.resumed_at = [int(r["step"]) for r in restarted]
    records.attempts = [{} for _ in range(len(starts) + 1)]
    times: list[list[float]] = [[] for _ in records.attempts]
    epochs: dict[int, EpochRecord] = {}
    for entry in _lines(metrics):
        if STEP_LOSS in entry:
            attempt = bisect.bisect_right(starts, float(entry["time"]))
            records.attempts[attempt][int(entry["step"])] = float(entry[STEP_LOSS])
            times[attempt].append(float(entry["time"]))
        elif "epoch" in entry:
            record = EpochRecord(
                epoch=int(entry["epoch"]) + 1,
                loss=float(entry["train/loss"]),
                accuracy=float(entry["test/accuracy"]),
                train_s=float(entry.get("time/train_s", 0.0)),
            )
            epochs[record.epoch] = record
            records.train_seconds += record.train_s
    records.epochs = [epochs[k] for k in sorted(epochs)]
    records.spans = [(min(t), max(t)) for t in times if t]
    return records


def _lines(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def job_breakdown(
    records: TrainingRecords, *, launched: float, ended: float
) -> list[tuple[str, float]]:
    """Where the training job's wall time went, from ``launched`` to ``ended`` (``time.time()``
    in the launching process), as (what, seconds): read from the times of the logged steps."""
    total = ended - launched
    if not records.spans:
        return [("the whole job", total)]
    parts = [
        (
            "ranks starting (torchrun, then each rank imports torch, joins the process group, "
            "loads data and model)",
            records.spans[0][0] - launched,
        ),
        ("training", records.train_seconds),
    ]
    gaps = [nxt[0] - prev[1] for prev, nxt in pairwise(records.spans)]
    if gaps:
        parts.append(("restart (new ranks import torch again, load the checkpoint)", sum(gaps)))
    parts.append(("evaluation, checkpoints, exit", total - sum(s for _, s in parts)))
    return parts
