"""One optimizer step, as ``run.step`` takes it: the window, the gradients, the round.

    path = StepPath(windows, Stepper(precision, strategy, 1.0), loop, stepped=on_step)
    path.step(optimizer, unit, scheduler)   # False inside an accumulation window

    stepper = Stepper(precision, strategy, max_grad_norm=1.0)
    stepped = stepper.apply(optimizer, unit.optimizers, correction=window.correction())
    stepper.last_grad_norm
    rounds.count(optimizer)      # True when this step begins a new round: global_step += 1

Several optimizers of one model are prepared together, as in torch's AMP recipe: the first of
them to step in a window unscales all of them and clips the model's total gradient norm once;
the others then only step. With several optimizers, a *round* is the set of optimizers stepping
once each (a GAN's D and G); the run's global step counts rounds, so it counts iterations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

from paratrain import faults
from paratrain.errors import ConfigError
from paratrain.runtime.accumulation import Windows
from paratrain.runtime.loop_state import LoopState
from paratrain.runtime.precision import Precision
from paratrain.runtime.registry import Unit
from paratrain.strategies import Strategy


class StepPath:
    """Everything ``run.step`` does after registration, in order: ask the model's accumulation
    window whether this call steps, step the gradients (:class:`Stepper`), close the window,
    count the round, step the scheduler."""

    def __init__(
        self,
        windows: Windows,
        stepper: Stepper,
        loop: LoopState,
        *,
        stepped: Callable[[bool], None],
    ) -> None:
        self.windows, self.stepper, self.loop = windows, stepper, loop
        self.rounds = StepRounds()
        self._stepped = stepped  # the loop's reaction: count the step (True: a new round), ...

    def step(self, optimizer: Optimizer, unit: Unit, scheduler: Any) -> bool:
        """Step ``optimizer`` of ``unit`` at the end of its window; True if it stepped."""
        window = self.windows.of(id(unit.module))
        if window is None and self.loop.grad_accum > 1:
            raise ConfigError(
                f"grad_accum={self.loop.grad_accum} but no `with run.accumulate(model):` block "
                "ran for this optimizer's model, so run.step cannot tell micro-batches from "
                "steps. Put the forward and run.backward inside `with run.accumulate(model):`."
            )
        if window is not None and (not window.sync or id(optimizer) in window.stepped):
            return False
        correction = window.correction() if window is not None else 1.0
        stepped = self.stepper.apply(optimizer, unit.optimizers, correction=correction)
        if window is not None:
            window.stepped.add(id(optimizer))
        if stepped:
            self._stepped(self.rounds.count(optimizer))
            if scheduler is not None:
                scheduler.step()
            faults.emit("step")
        return stepped


class Stepper:
    """The gradient side of an optimizer step."""

    def __init__(self, precision: Precision, strategy: Strategy, max_grad_norm: float | None):
        self.precision, self.strategy, self.max_grad_norm = precision, strategy, max_grad_norm
        self.last_grad_norm: float | None = None
        """Gradient norm before clipping at the last step (when ``max_grad_norm`` is set)."""
        self._prepared: set[int] = set()

    def apply(self, optimizer: Optimizer, siblings: list[Optimizer], *, correction: float) -> bool:
        """Step ``optimizer``; the first of ``siblings`` (its model's optimizers) to step
        unscales, multiplies by ``correction`` and clips for all. True unless fp16 skipped."""
        if len(siblings) == 1 and self.precision.scaler is None:  # the usual case, at once
            if correction != 1.0 or self.max_grad_norm is not None:
                self._prepare(siblings, correction)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return True
        if id(optimizer) in self._prepared:
            self._prepared.discard(id(optimizer))
        else:
            others = [o for o in siblings if o is not optimizer]
            self._prepare([optimizer, *others], correction)
            self._prepared -= {id(o) for o in siblings}
            self._prepared |= {id(o) for o in others}
        stepped = self.precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        return stepped

    def _prepare(self, optimizers: list[Optimizer], correction: float) -> None:
        for optimizer in optimizers:
            self.precision.unscale_(optimizer)
        if correction != 1.0 or self.max_grad_norm is not None:
            params = [
                p
                for optimizer in optimizers
                for g in optimizer.param_groups
                for p in g["params"]
                if p.grad is not None
            ]
            if correction != 1.0:
                torch._foreach_mul_([p.grad for p in params], correction)
            if self.max_grad_norm is not None:
                self.last_grad_norm = self.strategy.clip_grad_norm(params, self.max_grad_norm)


class StepRounds:
    """One global step per round: a round ends when an optimizer steps a second time.

    A GAN stepping D then G counts 1 per iteration; a critic stepped 5x per generator step
    counts 5."""

    def __init__(self) -> None:
        self._round: set[int] = set()

    def count(self, optimizer: Optimizer) -> bool:
        """Note that ``optimizer`` stepped; True when this begins a new round."""
        new = id(optimizer) in self._round or not self._round
        if id(optimizer) in self._round:
            self._round = set()
        self._round.add(id(optimizer))
        return new


def refuse_metric_scheduler(scheduler: Any) -> None:
    """``run.step`` steps its scheduler without arguments; one that needs a metric cannot be."""
    if isinstance(scheduler, ReduceLROnPlateau):
        raise ConfigError(
            "run.step(optimizer, scheduler) got a ReduceLROnPlateau, which steps on a metric "
            "(scheduler.step(val_loss)), not after every optimizer step. Call "
            "scheduler.step(metric) yourself after evaluating, and pass it to run.setup(..., "
            "scheduler=) or run.track(scheduler) so that checkpoints save and restore it."
        )
