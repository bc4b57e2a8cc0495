"""Random number generator states: captured per rank, restored exactly or re-derived.

    state = capture_rng()            # python, numpy, torch CPU (and every CUDA device)
    restore_rng(state)
    reseed_rng(seed=0, step=120, rank=3)    # when the world size changed since the save

Everything is plain tensors, ints and tuples, so it loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """This process's generator states."""
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)  # legacy=True always gives the tuple form
    kind, keys, pos, has_gauss, cached = np_state
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng` returned."""
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        devices = min(len(state["cuda"]), torch.cuda.device_count())
        torch.cuda.set_rng_state_all(state["cuda"][:devices])


def reseed_rng(*, seed: int, step: int, rank: int) -> None:
    """Seed every generator from (seed, step, rank): deterministic, distinct per rank."""
    derived = (seed * 1_000_003 + step * 8191 + rank) % 2**63
    random.seed(derived)
    np.random.seed(derived % 2**32)
    torch.manual_seed(derived)
