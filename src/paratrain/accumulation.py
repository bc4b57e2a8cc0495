"""Which micro-batches end an accumulation window, and how to weigh a short last window.

    acc = Accumulation(every=4)
    sync = acc.begin(last_batch=False)   # False for micro-batches 1-3, True for the 4th
    acc.correction()                     # 1.0 for a full window; 4/k for a last window of k

Each micro-batch loss is divided by ``every``; a window cut short by the end of the epoch holds only
``k`` micro-batches, so its gradient is multiplied by ``every / k`` to be the mean over the samples
it really saw, exactly as one large batch of those samples would give.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Accumulation:
    """Counts micro-batches in the current window."""

    every: int
    """Micro-batches per optimizer step (``grad_accum``)."""
    window: int = 0
    """Micro-batches run since the last step."""
    sync: bool = False
    """True when the micro-batch in flight ends the window (gradients must be synchronised)."""
    used: bool = False
    """True once :meth:`begin` was called: the loop uses accumulation windows."""

    def begin(self, *, last_batch: bool) -> bool:
        """Start a micro-batch; return True when its backward must synchronise gradients."""
        self.used = True
        self.window += 1
        self.sync = self.window >= self.every or last_batch
        return self.sync

    def correction(self) -> float:
        """Factor that turns the accumulated gradient into the mean over the window's samples."""
        return self.every / self.window if self.window else 1.0

    def reset(self) -> None:
        """Close the window after an optimizer step."""
        self.window = 0
        self.sync = False
