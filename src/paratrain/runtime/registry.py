"""Everything a checkpoint holds, registered once, by name.

    tracked = Registry()
    tracked.add_unit(model, [opt_g], name="model")   # run.setup
    tracked.add_scheduler(sched)            # run.setup(scheduler=), run.step, run.resume
    tracked.add_object(ema, "ema")          # run.track (per rank unless replicated=True)
    tracked.add_loader(loader)              # run.loader

Registration is idempotent (the same object twice keeps its first name). A resumed checkpoint may
hold state for something the script registers only later (a scheduler first passed to
``run.step``, a loader made after ``run.resume``): that state waits in :attr:`Registry.pending`
and is applied at registration, so nothing in a checkpoint is lost because of the order in which
a script does things.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torch.optim import Optimizer

from paratrain.data.loader import DeviceLoader
from paratrain.errors import ConfigError, ModelError

_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")


@dataclass(slots=True)
class Unit:
    """A model (as returned by ``run.setup``) and the optimizers that update it."""

    name: str
    module: nn.Module
    optimizers: list[Optimizer] = field(default_factory=list)


class Registry:
    """The registry of a run's stateful pieces."""

    def __init__(self) -> None:
        self.units: list[Unit] = []
        self.schedulers: dict[str, Any] = {}
        self.objects: dict[str, Any] = {}
        self.replicated: set[str] = set()
        """Names of objects declared the same on every rank (saved once, restored anywhere)."""
        self.loaders: list[DeviceLoader[Any]] = []
        self.pending: dict[str, Callable[[Any], None]] = {}
        """``"kind:name" -> apply(obj)``: resumed state waiting for its object."""
        self.notes: list[str] = []
        """What was applied late, for the run to print."""

    # -- registration ----------------------------------------------------------------------
    def add_unit(self, module: nn.Module, optimizers: list[Optimizer], name: str | None) -> Unit:
        """Register a set-up model and its optimizers."""
        name = self._name(name, "model", [u.name for u in self.units], "run.setup(..., name=)")
        for optimizer in optimizers:
            owner = self.unit_of(optimizer)
            if owner is not None:
                raise ModelError(
                    f"This optimizer was already given to run.setup with model {owner.name!r}. "
                    "Give each optimizer to run.setup once, with the model it updates."
                )
        unit = Unit(name, module, list(optimizers))
        self.units.append(unit)
        self._claim(f"model:{name}", unit)
        return unit

    def only_unit(self, caller: str) -> Unit | None:
        """The one set-up model (None before setup); several are an error naming ``caller``."""
        if len(self.units) > 1:
            raise ConfigError(
                f"{caller}() with {len(self.units)} models set up: name the one you mean, "
                f"{caller}(model)."
            )
        return self.units[0] if self.units else None

    def unit_of(self, optimizer: Optimizer) -> Unit | None:
        """The unit ``optimizer`` belongs to (None: not registered)."""
        for unit in self.units:
            if optimizer in unit.optimizers:  # optimizers compare by identity
                return unit
        return None

    def attach_optimizer(self, optimizer: Optimizer) -> Unit:
        """Register an optimizer that ``run.setup`` did not see, with the model it updates."""
        params = {id(p) for g in optimizer.param_groups for p in g["params"]}
        for unit in self.units:
            if params <= {id(p) for p in unit.module.parameters()}:
                unit.optimizers.append(optimizer)
                return unit
        raise ModelError(
            "run.step got an optimizer whose parameters are not those of a model returned by "
            "run.setup. Build the optimizer from the set-up model's parameters and pass both to "
            "run.setup(model, optimizer)."
        )

    def add_scheduler(self, scheduler: Any, name: str | None = None) -> None:
        """Register a learning-rate scheduler (or anything with state_dict/load_state_dict)."""
        if any(s is scheduler for s in self.schedulers.values()):
            return
        _check_stateful(scheduler, "scheduler")
        name = self._name(name, "scheduler", list(self.schedulers), "name=")
        self.schedulers[name] = scheduler
        self._claim(f"scheduler:{name}", scheduler)

    def add_object(self, obj: Any, name: str | None, *, replicated: bool = False) -> str:
        """Register any object with state_dict/load_state_dict (``run.track``). Its state is
        saved per rank; ``replicated`` declares it the same on every rank (saved once)."""
        for key, value in self.objects.items():
            if value is obj:
                return key
        _check_stateful(obj, "run.track")
        name = self._name(name, type(obj).__name__, list(self.objects), "run.track(obj, name=)")
        self.objects[name] = obj
        if replicated:
            self.replicated.add(name)
        self._claim(f"object:{name}", obj)
        return name

    def add_loader(self, loader: DeviceLoader[Any]) -> None:
        """Register a training loader; its position is saved with every checkpoint."""
        loader.name = self._name(None, "loader", [ld.name for ld in self.loaders], "")
        self.loaders.append(loader)
        self._claim(f"loader:{loader.name}", loader)

    # -- resumed state that waits for its object -------------------------------------------------
    def defer(self, key: str, apply: Callable[[Any], None]) -> None:
        """Keep ``apply`` until the object ``key`` (``"kind:name"``) is registered."""
        self.pending[key] = apply

    def _claim(self, key: str, obj: Any) -> None:
        apply = self.pending.pop(key, None)
        if apply is not None:
            apply(obj)
            self.notes.append(f"{key.replace(':', ' ')} restored from the checkpoint")

    @staticmethod
    def _name(name: str | None, base: str, taken: list[str], how: str) -> str:
        if name is None:
            name, k = base, 1
            while name in taken:
                name, k = f"{base}_{k}", k + 1
            return name
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigError(
                f"name {name!r} is not usable in a checkpoint: use 1 to 64 letters, digits, _ "
                "and - only."
            )
        if name in taken:
            raise ConfigError(
                f"name {name!r} is already registered; give each one its own name ({how})."
            )
        return name


def _check_stateful(obj: Any, what: str) -> None:
    if not (
        callable(getattr(obj, "state_dict", None))
        and callable(getattr(obj, "load_state_dict", None))
    ):
        raise ConfigError(
            f"{what}: {type(obj).__name__} has no state_dict()/load_state_dict(), so a "
            "checkpoint cannot save and restore it. Pass an object that has both (schedulers, "
            "optimizers, modules, AveragedModel do)."
        )
