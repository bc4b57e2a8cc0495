"""Seed every random number generator a training script touches.

seed_everything(0)   # python, numpy, torch (CPU and every CUDA device)
"""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy and torch alike, so all ranks build identical models."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
