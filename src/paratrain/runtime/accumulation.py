"""Accumulation windows: which micro-batches end a window, one window per model.

    windows = Windows(every=4)
    w = windows.begin(model, pass_length=10, in_pass=3)   # sync False for micro-batches 1-3
    w.sync                                                   # True on the 4th (or the pass's last)
    w.correction()                                           # 4/k for a short last window of k
    windows.stepped(w, optimizer)                            # after run.step stepped it

Each model has its own window: a GAN whose discriminator and generator each run in their own
``run.accumulate`` gets ``every`` micro-batches per step for both, and two optimizers of one model
both step at the end of the shared window. Each micro-batch loss is divided by ``every``; a window
cut short by the end of the epoch holds only ``k`` micro-batches, so its gradient is multiplied by
``every / k``: the mean of the ``k`` micro-batch means (equal to the mean over the samples seen
when the micro-batches are equally large).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paratrain.core import faults
from paratrain.errors import ConfigError


@dataclass(slots=True)
class Window:
    """The accumulation window of one model."""

    every: int
    """Micro-batches per optimizer step (``grad_accum``)."""
    count: int = 0
    """Micro-batches run in this window."""
    sync: bool = False
    """True once the micro-batch that ends the window has begun (gradients synchronised)."""
    open_block: bool = False
    """True while a ``run.accumulate`` block of this model runs (nesting is an error)."""
    stepped: set[int] = field(default_factory=set)
    """ids of the optimizers stepped at the end of this window."""

    def correction(self) -> float:
        """Factor that turns the accumulated gradient into the mean over the window."""
        return self.every / self.count if self.count else 1.0

    @property
    def pending(self) -> bool:
        """True while gradients of this window have not been applied by a step."""
        return self.count > 0 and not (self.sync and self.stepped)


class Windows:
    """The accumulation windows of every model of a run."""

    def __init__(self, every: int) -> None:
        self.every = every
        self._windows: dict[int, Window] = {}
        self.used = False
        """True once a ``run.accumulate`` block ran: the loop marks its micro-batches."""

    def of(self, key: int) -> Window | None:
        """The window of the model with id ``key`` (None before its first micro-batch)."""
        return self._windows.get(key)

    def begin(self, key: int, *, last: bool) -> Window:
        """Start a micro-batch of model ``key``; ``last`` when it is the pass's last one."""
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = Window(self.every)
        if window.open_block:
            raise ConfigError(
                "run.accumulate(model) was entered again inside a run.accumulate block of the "
                "same model: every micro-batch would count twice. Use one block per micro-batch "
                "(blocks of two different models may nest, e.g. a GAN's D(G(z)))."
            )
        if window.sync:  # the previous window ended: start a new one
            window.count, window.sync, window.stepped = 0, False, set()
        window.every = self.every
        window.count += 1
        window.sync = window.count >= window.every or last
        window.open_block = True
        self.used = True
        return window

    def end(self, key: int) -> None:
        """The ``run.accumulate`` block of model ``key`` finished."""
        window = self._windows[key]
        window.open_block = False
        if not window.sync:
            faults.emit("mid_window")  # its gradients are held for the next micro-batch

    def pending(self) -> list[Window]:
        """Windows whose gradients wait for a step."""
        return [w for w in self._windows.values() if w.pending]

    def drop_pending(self) -> int:
        """Forget unfinished windows (their gradients are zeroed by the caller)."""
        dropped = 0
        for window in self._windows.values():
            if window.pending:
                dropped = max(dropped, window.count)
                window.count, window.sync, window.stepped = 0, False, set()
        return dropped

    def set_every(self, every: int) -> None:
        """Change the micro-batches per step (between steps only)."""
        if self.pending():
            raise ConfigError(
                "grad_accum cannot change inside an accumulation window. Change it right after "
                "run.step()."
            )
        self.every = every
