"""How many GPUs torch will see, without importing torch on a machine that has none.

    gpus = visible_gpus()    # torch.cuda.device_count(), or 0 at once on a CPU-only Linux host

Importing torch takes a second or more; the launcher and verify-resume only need the count, and
the ranks import torch themselves. On Linux a GPU torch can use has a device node: NVIDIA's
(``/dev/nvidia0``...), AMD's ROCm (``/dev/kfd``) or WSL's (``/dev/dxg``). With none of them, the
count is 0 without asking torch; with any of them, or on another system, torch answers.
"""

from __future__ import annotations

import sys
from pathlib import Path

DEVICE_NODES = ("nvidia[0-9]*", "kfd", "dxg")
"""Device nodes under /dev of the GPUs torch.cuda can use (NVIDIA, ROCm, WSL)."""


def visible_gpus(dev: Path = Path("/dev")) -> int:
    """``torch.cuda.device_count()``; 0 without importing torch on Linux without GPU nodes."""
    if "torch" not in sys.modules and sys.platform.startswith("linux") and dev.is_dir():
        if not any(any(dev.glob(pattern)) for pattern in DEVICE_NODES):
            return 0
    import torch

    return torch.cuda.device_count()
