"""Plan mode inside ``pt.Run``: the script runs on fake tensors until its first optimizer step.

``paratrain plan`` runs the script in :mod:`paratrain.commands.plan.fake_run`, which sets
:data:`ACTIVE` before the script starts. ``pt.Run`` then resolves to one CPU process (no process
group, no checkpoints resumed or saved, no trackers) and calls the probe:

    run.setup(model, optimizer)   ->  probe.watch(model, optimizers)   # the model's first inputs
    run.step(optimizer)           ->  probe.before_step() / probe.stepped()   # raises PlanComplete

so that one training step of the script's own model, optimizer, batch and loss is measured by
torch's ``MemTracker`` without any memory behind the tensors. Given ``checkpoint``, the probe
then checkpoints the model's repeated blocks and lets the script run a second step, measured
too: what recomputing the activations saves, with the script's own loss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torch.optim import Optimizer

from paratrain.config import RunConfig


class PlanComplete(BaseException):
    """Raised by ``run.step`` once the first step is measured; ends the script (a BaseException,
    so that a script's ``except Exception`` does not take it for an error of its own)."""


@dataclass
class Captured:
    """What the script handed to ``pt.Run`` before its first step."""

    model: nn.Module | None = None
    optimizers: list[Optimizer] = field(default_factory=list)
    inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    """The first forward's positional and keyword arguments (fake tensors)."""
    before_step: dict[str, int] = field(default_factory=dict)
    """Bytes per category at the peak of forward and backward (the optimizer not stepped yet)."""
    step: dict[str, int] = field(default_factory=dict)
    """Bytes per category at the peak of the whole first step, optimizer step included."""
    optimizer_state: int = 0
    """Bytes of optimizer state after the first step (held from the second step on)."""
    after_step: dict[str, int] = field(default_factory=dict)
    """Bytes per category held after the first step (what the second step starts with)."""
    checkpointed: list[str] = field(default_factory=list)
    """Names of the blocks whose activations the second step recomputed (none: one step)."""
    checkpointed_step: dict[str, int] = field(default_factory=dict)
    """Bytes per category at the peak of the second step, with ``checkpointed`` recomputed."""


class Probe:
    """The hooks ``pt.Run`` calls in plan mode (see the module docstring)."""

    def __init__(
        self,
        tracker: Any,
        run_dir: str,
        checkpoint: Callable[[nn.Module, RunConfig], list[str]] | None = None,
    ) -> None:
        self.tracker = tracker  # torch.distributed._tools.mem_tracker.MemTracker
        self.run_dir = run_dir
        self.checkpoint = checkpoint
        """Checkpoints blocks of the model after the first step and names them (none: the plan
        ends there); the second step, recomputing them, is measured too."""
        self.captured = Captured()
        self.settings: RunConfig | None = None
        """The script's own settings (its strategy's options: fsdp units, precision, ...)."""

    def config(self, config: RunConfig) -> RunConfig:
        """The script's settings, reduced to one CPU process that leaves nothing behind."""
        self.settings = config
        default = RunConfig()
        # Options of the script's own strategy: the plan derives every strategy from one process.
        foreign = {
            f.name: getattr(default, f.name)
            for f in dataclasses.fields(RunConfig)
            if f.name.startswith(("fsdp_", "tp_", "pipeline_", "powersgd_"))
            or f.name
            in (
                "mesh",
                "n_microbatches",
                "device_ids",
                "sync_batchnorm",
                "find_unused_parameters",
                "broadcast_buffers",
                "static_graph",
                "comm_hook",
            )
        }
        return dataclasses.replace(
            config,
            **foreign,
            strategy="cpu",
            accelerator="cpu",
            previous_run="fresh",
            run_dir=self.run_dir,
            ckpt_dir=None,
            preempt_signals=None,
            watchdog=False,
            tensorboard=False,
            log_to=(),
            progress=False,
            stats_every=None,
            profile=None,
            async_save=False,
            num_workers=0,
            global_batch=None,
        )

    def watch(self, model: nn.Module, optimizers: list[Optimizer]) -> None:
        """Track ``model`` and ``optimizers``; keep the first forward's inputs."""
        if self.captured.model is None:
            self.captured.model = model
            model.register_forward_pre_hook(self._first_inputs, with_kwargs=True)
        self.captured.optimizers += optimizers
        for optimizer in optimizers:
            self.tracker.track_external(model, optimizer)
        if not optimizers:
            self.tracker.track_external(model)

    def _first_inputs(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self.captured.inputs is None:
            self.captured.inputs = (args, kwargs)

    def before_step(self) -> None:
        """At ``run.step``, before the optimizer: the peak of forward and backward so far."""
        if not self.captured.before_step:
            self.captured.before_step = categories(self.tracker, "peak")

    def stepped(self) -> None:
        """After the first optimizer step: the step's peak, the optimizer's state; then either
        stop, or checkpoint the model's blocks and measure the second step too."""
        if self.captured.checkpointed:
            self.captured.checkpointed_step = categories(self.tracker, "peak")
            raise PlanComplete
        self.captured.step = categories(self.tracker, "peak")
        self.captured.after_step = categories(self.tracker, "current")
        self.captured.optimizer_state = self.captured.after_step.get("Optstate", 0)
        model, settings = self.captured.model, self.settings
        if self.checkpoint is None or model is None or settings is None:
            raise PlanComplete
        self.captured.checkpointed = self.checkpoint(model, settings)
        if not self.captured.checkpointed:
            raise PlanComplete
        self.tracker.reset_peak()


def categories(tracker: Any, which: str) -> dict[str, int]:
    """MemTracker's snapshot (``"peak"`` or ``"current"``) summed over devices, by category
    name (``Parameter``, ``Gradient``, ``Optstate``, ``Activation``, ``Temp``, ``Buffer``, ...)."""
    out: dict[str, int] = {}
    for per_device in tracker.get_tracker_snapshot(which).values():
        for kind, size in per_device.items():
            name = str(getattr(kind, "value", kind))
            out[name] = out.get(name, 0) + int(size)
    return out


ACTIVE: Probe | None = None
"""The probe of this process when ``paratrain plan`` runs the script in it, else None."""
