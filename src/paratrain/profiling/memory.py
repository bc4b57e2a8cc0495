"""Peak memory of this process: CUDA allocator peak on GPUs, peak RSS on CPU (Linux).

reset_peak_memory(device)
...
peak_memory_mb(device)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: CUDA allocator stats, or the process's peak RSS (Linux)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_memory_mb(device: torch.device) -> float:
    """Peak since :func:`reset_peak_memory`: CUDA max allocated, or peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")
