"""Per-rank training stats as JSON lines, for ``paratrain monitor`` and ``paratrain bench``.

    writer = StatsWriter(Path("runs/exp/stats"), rank=0, every=10, device=device)
    if writer.due(step=120):                                 # after each optimizer step
        writer.step(step=120, samples=7680, data_wait_s=1.9)
    writer.close()

Every ``every`` steps one line goes to ``stats/rank<r>.jsonl``: time, rank, pid, step, mean step
time, samples/s, the fraction of wall time spent waiting for data, and peak memory.

A record costs about a microsecond, so that small models (steps of half a millisecond) do not
pay for it: records are written out at most every :data:`WRITE_EVERY_S` seconds (and at
``close``) to a file that stays open, and the peak memory is read at most once a second (on a
GPU, reading the allocator's statistics costs tens of microseconds; on CPU it is the process's
peak resident size, one system call).
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import IO, Any

import torch

MEMORY_EVERY_S = 1.0
"""Seconds between two readings of the peak memory (the records in between repeat it)."""
WRITE_EVERY_S = 0.5
"""Seconds between two writes to the file (``monitor`` sees a record at most this late)."""


class StatsWriter:
    """Appends one record every ``every`` optimizer steps."""

    def __init__(self, directory: Path, *, rank: int, every: int, device: torch.device) -> None:
        self.path = directory / f"rank{rank}.jsonl"
        self.rank, self.every, self.device = rank, every, device
        self._last = (time.perf_counter(), 0, 0, 0.0)  # time, step, samples, data wait
        self._file: IO[str] | None = None
        self._pending: list[dict[str, Any]] = []
        self._written = time.perf_counter()
        self._where = (os.getpid(), str(device))
        self._memory = (-MEMORY_EVERY_S, float("nan"))  # when read, value

    def due(self, step: int) -> bool:
        """Whether a record is due at optimizer step ``step``."""
        return step - self._last[1] >= self.every

    def step(self, *, step: int, samples: int, data_wait_s: float) -> None:
        """Called after an optimizer step; keeps a record when ``every`` steps have passed."""
        then, last_step, last_samples, last_wait = self._last
        if step - last_step < self.every:
            return
        now = time.perf_counter()
        elapsed = max(now - then, 1e-9)
        pid, device = self._where
        record = {
            "time": time.time(),
            "rank": self.rank,
            "pid": pid,
            "step": step,
            "step_time_s": elapsed / (step - last_step),
            "samples_per_s": (samples - last_samples) / elapsed if samples else None,
            "data_wait_fraction": min(1.0, (data_wait_s - last_wait) / elapsed),
            "peak_memory_mb": self._peak_memory(now),
            "device": device,
        }
        self._pending.append(record)
        self._last = (now, step, samples, data_wait_s)
        if now - self._written >= WRITE_EVERY_S or (len(self._pending) == 1 and not self._file):
            self.flush()

    def flush(self) -> None:
        """Write the records kept so far (the first one is written at once)."""
        self._written = time.perf_counter()
        if not self._pending:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
            atexit.register(self.close)  # a script that never closes its run keeps its records
        self._file.write("".join(json.dumps(r) + "\n" for r in self._pending))
        self._file.flush()
        self._pending.clear()

    def close(self) -> None:
        """Write what is kept and close the file (a later record opens it again)."""
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None
            atexit.unregister(self.close)

    def _peak_memory(self, now: float) -> float:
        read_at, value = self._memory
        if now - read_at >= MEMORY_EVERY_S:
            value = process_peak_mb(self.device)
            self._memory = (now, value)
        return value


def process_peak_mb(device: torch.device) -> float:
    """The peak memory of this process so far: the CUDA allocator's peak on a GPU, the peak
    resident size on CPU (``getrusage``; kilobytes on Linux, bytes on macOS)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
