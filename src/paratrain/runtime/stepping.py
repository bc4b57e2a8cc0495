"""One optimizer step, as ``run.step`` takes it: the window, the gradients, the round.

    path = StepPath(windows, Stepper(precision, strategy, 1.0), loop, stepped=on_step)
    path.step(optimizer, unit, scheduler)   # False inside an accumulation window

    stepper = Stepper(precision, strategy, max_grad_norm=1.0)
    stepped = stepper.apply(optimizer, unit, correction=window.correction())
    stepper.last_grad_norm
    rounds.count(unit, optimizer)   # True when this step begins a new round: global_step += 1

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

from paratrain.core import faults
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
        stepped: Callable[[bool, Callable[[], bool]], None],
    ) -> None:
        self.windows, self.stepper, self.loop = windows, stepper, loop
        self.rounds = StepRounds(loop)
        self._stepped = stepped  # the loop's reaction: (new round, is the round complete?) -> ...

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
        stepped = self.stepper.apply(optimizer, unit, correction=correction)
        if window is not None:
            window.stepped.add(id(optimizer))
        if stepped:
            self._stepped(self.rounds.count(unit, optimizer), self.rounds.complete)
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
        self._prepared: dict[int, int] = {}
        """Optimizers prepared by a sibling, with the gradients' generation they were
        prepared for."""
        self.generation = 0
        """Counts ``run.backward`` calls: a preparation holds only for the gradients it saw."""
        self._order: dict[tuple[int, ...], list[torch.Tensor]] = {}

    def apply(self, optimizer: Optimizer, unit: Unit, *, correction: float) -> bool:
        """Step ``optimizer`` of ``unit``; the first of the unit's optimizers to step unscales,
        multiplies by ``correction`` and clips for all. True unless fp16 skipped."""
        siblings = unit.optimizers
        if len(siblings) == 1 and self.precision.scaler is None:  # the usual case, at once
            if correction != 1.0 or self.max_grad_norm is not None:
                self._prepare(siblings, unit, correction)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return True
        if self._prepared.pop(id(optimizer), None) != self.generation:
            others = [o for o in siblings if o is not optimizer]
            self._prepare([optimizer, *others], unit, correction)
            for other in others:  # they step on these gradients without preparing again
                self._prepared[id(other)] = self.generation
        stepped = self.precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        return stepped

    def _prepare(self, optimizers: list[Optimizer], unit: Unit, correction: float) -> None:
        for optimizer in optimizers:
            self.precision.unscale_(optimizer)
        if correction != 1.0 or self.max_grad_norm is not None:
            params = [p for p in self._in_model_order(optimizers, unit) if p.grad is not None]
            if correction != 1.0:
                torch._foreach_mul_([p.grad for p in params if p.grad is not None], correction)
            if self.max_grad_norm is not None:
                self.last_grad_norm = self.strategy.clip_grad_norm(params, self.max_grad_norm)

    def _in_model_order(self, optimizers: list[Optimizer], unit: Unit) -> list[torch.Tensor]:
        """The model's parameters in the order ``model.parameters()`` gives them, as the
        script's own ``clip_grad_norm_(model.parameters(), ...)`` sums the norm (the order of
        the optimizers' groups, decay and no-decay say, would round differently), including
        parameters no optimizer holds (a frozen backbone that still gets gradients).
        Parameters an optimizer holds outside the model come last, in the optimizers' order.
        Made again when a group is added (``add_param_group``)."""
        key = (id(unit.module), *(x for o in optimizers for x in (id(o), len(o.param_groups))))
        cached = self._order.get(key)
        if cached is None:
            held = {id(p): p for o in optimizers for g in o.param_groups for p in g["params"]}
            model = list(unit.module.parameters())
            for p in model:
                held.pop(id(p), None)
            cached = self._order[key] = model + list(held.values())
        return cached


class StepRounds:
    """The rule of ``run.global_step``: **it counts rounds, a round being one step of each
    optimizer that takes part; a step begins a new round when its optimizer already stepped in
    the current round, or when it is the first step of an optimizer that was not in the last
    complete round.**

    A round is complete (its members known) once one of its optimizers steps again. So a GAN
    stepping D then G counts 1 per iteration; two optimizers of one model, 1 per iteration;
    model a trained 5 steps and then model b 5 steps counts 10; a critic stepped 5 times per
    generator step counts 5 per generator step (6 for the first: the generator's first step
    follows complete rounds of the critic alone). The state is the loop's (saved with it)::

        rounds = StepRounds(loop)
        rounds.count(unit, optimizer)   # True: a new round (global_step += 1)
    """

    def __init__(self, loop: LoopState) -> None:
        self.loop = loop
        self._keys: dict[int, str] = {}

    def key(self, unit: Unit, optimizer: Optimizer) -> str:
        """``"model:index"``: the optimizer as the saved round names it."""
        key = self._keys.get(id(optimizer))
        if key is None:
            key = self._keys[id(optimizer)] = f"{unit.name}:{unit.optimizers.index(optimizer)}"
        return key

    def count(self, unit: Unit, optimizer: Optimizer) -> bool:
        """Note that ``optimizer`` of ``unit`` stepped; True when this begins a new round."""
        key = self.key(unit, optimizer)
        loop = self.loop
        current, members = loop.round_open, loop.round_members
        if not current:
            current.append(key)
            return True
        if key in current:  # the round is complete: its members are known
            loop.round_members = list(current)
            loop.round_open = [key]
            return True
        if members is not None and key not in members:  # a newcomer after complete rounds
            loop.round_open = [key]
            return True
        current.append(key)
        return False

    def complete(self) -> bool:
        """True when the round in progress holds every member of the last complete round (no
        optimizer of the round is still to step); True before the first step."""
        loop = self.loop
        if not loop.round_open:
            return True
        return loop.round_members is not None and set(loop.round_open) >= set(loop.round_members)


def refuse_metric_scheduler(scheduler: Any) -> None:
    """``run.step`` steps its scheduler without arguments; one that needs a metric cannot be."""
    if isinstance(scheduler, ReduceLROnPlateau):
        raise ConfigError(
            "run.step(optimizer, scheduler) got a ReduceLROnPlateau, which steps on a metric "
            "(scheduler.step(val_loss)), not after every optimizer step. Call "
            "scheduler.step(metric) yourself after evaluating, and pass it to run.setup(..., "
            "scheduler=) or run.track(scheduler) so that checkpoints save and restore it."
        )
