"""Per-rank training stats as JSON lines, for ``paratrain monitor`` and ``paratrain bench``.

    writer = StatsWriter(Path("runs/exp/stats"), rank=0, every=10, device=device)
    writer.step(step=120, samples=7680, data_wait_s=1.9)    # after each optimizer step

Every ``every`` steps one line goes to ``stats/rank<r>.jsonl``: time, rank, pid, step, mean step
time, samples/s, the fraction of wall time spent waiting for data, and peak memory.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from paratrain.profiling.memory import peak_memory_mb


class StatsWriter:
    """Appends one record every ``every`` optimizer steps."""

    def __init__(self, directory: Path, *, rank: int, every: int, device: torch.device) -> None:
        self.path = directory / f"rank{rank}.jsonl"
        self.rank, self.every, self.device = rank, every, device
        self._last = (time.perf_counter(), 0, 0, 0.0)  # time, step, samples, data wait

    def step(self, *, step: int, samples: int, data_wait_s: float) -> None:
        """Called after every optimizer step; writes when ``every`` steps have passed."""
        then, last_step, last_samples, last_wait = self._last
        if step - last_step < self.every:
            return
        now = time.perf_counter()
        elapsed = max(now - then, 1e-9)
        record = {
            "time": time.time(),
            "rank": self.rank,
            "pid": os.getpid(),
            "step": step,
            "step_time_s": elapsed / (step - last_step),
            "samples_per_s": (samples - last_samples) / elapsed if samples else None,
            "data_wait_fraction": min(1.0, (data_wait_s - last_wait) / elapsed),
            "peak_memory_mb": peak_memory_mb(self.device),
            "device": str(self.device),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        self._last = (now, step, samples, data_wait_s)
