"""Seed every random number generator a training script touches.

seed_everything(0)          # python, numpy, torch (CPU and every CUDA device): all ranks alike
seed_rank_stream(0, rank)   # from here on, every rank draws its own numbers
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


def rank_seed(seed: int, rank: int) -> int:
    """The seed of ``rank``'s own random stream: ``seed`` on rank 0, distinct elsewhere."""
    return seed if rank == 0 else (seed * 1_000_003 + rank * 7919 + 1) % 2**63


def seed_rank_stream(seed: int, rank: int) -> None:
    """Give ``rank`` its own stream (rank 0 keeps the stream it has: one process is unchanged)."""
    if rank != 0:
        seed_everything(rank_seed(seed, rank))
