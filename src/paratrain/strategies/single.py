"""``single``: one process on one GPU.

The GPU is ``cuda:<local rank>`` of the GPUs visible to the process, so ``CUDA_VISIBLE_DEVICES=3``
makes physical GPU 3 appear as ``cuda:0``; :func:`visible_gpu_label` names the physical one.
"""

from __future__ import annotations

import os
from typing import ClassVar

from paratrain.strategies.base import Strategy


class SingleDeviceStrategy(Strategy):
    """Train in this process on one GPU."""

    name: ClassVar[str] = "single"
    needs_cuda: ClassVar[bool] = True


def visible_gpu_label(index: int) -> str:
    """``"cuda:0 (physical GPU 3 via CUDA_VISIBLE_DEVICES=3)"`` or ``"cuda:0"``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return f"cuda:{index}"
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if index < len(ids):
        return f"cuda:{index} (physical GPU {ids[index]} via CUDA_VISIBLE_DEVICES={visible})"
    return f"cuda:{index}"
