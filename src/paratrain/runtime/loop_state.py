"""Where the training loop is: epoch, step, micro-batches per step. Saved by every checkpoint.

    loop = LoopState(grad_accum=4)
    loop.global_step += 1
    state = loop.state_dict()        # {"epoch": 0, "global_step": 1, "grad_accum": 4}
    loop.load_state_dict(state)

The position inside an epoch belongs to each training loader
(:class:`paratrain.data.loader.Position`); :func:`epoch_to_save` combines the two for a checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from paratrain.data.loader import DeviceLoader


@dataclass(slots=True)
class LoopState:
    """The loop's counters."""

    epoch: int = 0
    """Current epoch (0-based), advanced by ``run.epochs``."""
    global_step: int = 0
    """Optimizer steps taken (a round in which several optimizers step counts once)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    epoch_start_step: int = 0
    """``global_step`` when the current epoch began."""
    last_epoch_steps: int | None = None
    """Steps of the last epoch that ran to its end (None before the first)."""
    mid_epoch_saves: bool = False
    """True once a save was followed by a step in the same epoch of a loop whose batches no
    training loader hands out: from then on only a save after as many steps as the last whole
    epoch counts as an epoch's end."""
    round_open: list[str] = field(default_factory=list)
    """Optimizers (``"model:index"``) that stepped in the round in progress (see
    :class:`paratrain.runtime.stepping.StepRounds`)."""
    round_members: list[str] | None = None
    """The optimizers of the last complete round (None before one completed)."""
    in_epochs: bool = False
    """True while ``run.epochs`` drives the loop (not saved)."""
    end_claimed: int | None = None
    """The epoch whose end the last save claimed (not saved)."""

    def state_dict(self) -> dict[str, Any]:
        """The counters as plain data."""
        saved = asdict(self)
        del saved["in_epochs"], saved["end_claimed"]
        return saved

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore epoch and step; ``grad_accum`` stays as configured (a changed global batch
        is reported by the resume, and kept only when asked)."""
        self.epoch = int(state["epoch"])
        self.global_step = int(state["global_step"])
        self.epoch_start_step = int(state.get("epoch_start_step", self.global_step))
        last = state.get("last_epoch_steps")
        self.last_epoch_steps = None if last is None else int(last)
        self.mid_epoch_saves = bool(state.get("mid_epoch_saves", False))
        self.round_open = [str(k) for k in state.get("round_open", [])]
        members = state.get("round_members")
        self.round_members = None if members is None else [str(k) for k in members]
        self.end_claimed = None

    def next_epoch(self) -> None:
        """The epoch's body ran to its end (``run.epochs`` moves on)."""
        self.last_epoch_steps = self.global_step - self.epoch_start_step
        self.epoch += 1
        self.epoch_start_step = self.global_step
        self.end_claimed = None

    def stepped(self) -> bool:
        """Count a step. True when it follows a save that claimed this epoch's end (a save in
        the middle of an epoch of a loop that makes its own batches), the first time."""
        self.global_step += 1
        if self.end_claimed != self.epoch:
            return False
        self.end_claimed = None
        first = not self.mid_epoch_saves
        self.mid_epoch_saves = True
        return first


def loop_to_save(loop: LoopState, loaders: Iterable[DeviceLoader[Any]]) -> dict[str, Any]:
    """The loop state a checkpoint taken now holds: the epoch it continues in (see
    :func:`epoch_to_save`); a save that ends an epoch starts the next one."""
    epoch = epoch_to_save(loop, loaders)
    saved = loop.state_dict()
    if epoch > loop.epoch:
        loop.end_claimed = loop.epoch
        saved.update(
            epoch=epoch,
            epoch_start_step=loop.global_step,
            last_epoch_steps=loop.global_step - loop.epoch_start_step,
        )
    return saved


def epoch_to_save(loop: LoopState, loaders: Iterable[DeviceLoader[Any]]) -> int:
    """The epoch a checkpoint taken now continues in.

    A save after the epoch's training pass ran to its end (no training pass in progress, one
    finished in this epoch) is an end-of-epoch save: resume starts the next epoch rather than
    running the rest of this epoch's loop body (a per-epoch scheduler step, an evaluation) twice.
    A save at the top of an epoch, before its pass starts, continues in that epoch. A loader
    whose pass ended before any step (data read once, ``next(iter(loader))``) is no pass of
    the loop and ends nothing. So does a
    save after the loop was left with ``break`` (``run.epochs`` ended early, or no
    ``run.epochs``): the loader continues its pass where the steps stopped. Inside a
    ``run.epochs`` body, a save after the pass was left with ``break`` following some steps (an
    epoch cut short: ``if i == limit: break``) ends the epoch.

    In a ``run.epochs`` loop that makes its own batches (no training loader ran a pass in this
    epoch), a save after at least one step of the epoch ends it. Once the loop was seen to step
    after such a save within the same epoch (it saves mid-epoch), only a save after as many
    steps as the last whole epoch took ends it.
    """
    epoch = loop.epoch
    train = [ld for ld in loaders if ld.train]
    if any(ld.in_progress for ld in train):
        return epoch
    train = [ld for ld in train if not ld.read_before_steps]  # data read once: no pass
    if any(ld.position.epoch == epoch and ld.position.finished for ld in train):
        return epoch + 1
    if loop.in_epochs and any(ld.left_after_steps for ld in train):
        return epoch + 1  # `if i == limit: break` inside the epoch: the rest is its end
    if not loop.in_epochs or any(ld.position.epoch == epoch for ld in train):
        return epoch
    steps = loop.global_step - loop.epoch_start_step
    if steps == 0:
        return epoch
    if loop.mid_epoch_saves:
        return epoch + 1 if steps == loop.last_epoch_steps else epoch
    return epoch + 1
