"""Where the training loop is: epoch, step, micro-batches per step. Saved by every checkpoint.

    loop = LoopState(grad_accum=4)
    loop.global_step += 1
    state = loop.state_dict()        # {"epoch": 0, "global_step": 1, "grad_accum": 4}
    loop.load_state_dict(state)

The position inside an epoch belongs to each training loader (:class:`paratrain.data.Position`);
:func:`epoch_to_save` combines the two for a checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from paratrain.data import DeviceLoader


@dataclass(slots=True)
class LoopState:
    """The loop's counters."""

    epoch: int = 0
    """Current epoch (0-based), advanced by ``run.epochs``."""
    global_step: int = 0
    """Optimizer steps taken (a round in which several optimizers step counts once)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""

    def state_dict(self) -> dict[str, int]:
        """The counters as plain data."""
        return asdict(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore epoch and step; ``grad_accum`` stays as configured (a changed global batch
        is reported by the resume, and kept only when asked)."""
        self.epoch = int(state["epoch"])
        self.global_step = int(state["global_step"])


def epoch_to_save(epoch: int, loaders: Iterable[DeviceLoader[Any]]) -> int:
    """The epoch a checkpoint taken now continues in.

    A save after the epoch's training pass ran to its end (no training pass in progress, one
    finished in this epoch) is an end-of-epoch save: resume starts the next epoch rather than
    running the rest of this epoch's loop body (a per-epoch scheduler step, an evaluation) twice.
    A save at the top of an epoch, before its pass starts, continues in that epoch.
    """
    train = [ld for ld in loaders if ld.train]
    if any(ld.in_progress for ld in train):
        return epoch
    if any(ld.position.epoch == epoch and ld.position.finished for ld in train):
        return epoch + 1
    return epoch
