"""Per-rank peak memory of one training step under each strategy, from one fake step.

    rows = plans(captured, world=4, config=config)     # after the script's first step
    best = recommend(rows, capacity=80 * 2**30)

- **one process** (``cpu``/``single``): the script's own step as measured, steady state: from the
  second step on, forward and backward run with the optimizer's state held.
- **ddp**: the same, plus DDP's gradient buckets (a flat copy of every gradient, kept for the run),
  plus one bucket still in flight at the optimizer step (or two copies of every bucket while DDP
  rebuilds them at the second step's start, when that is more).
- **fsdp** (and ``fsdp, no reshard``): the model sharded with paratrain's own ``fully_shard`` units
  over a fake process group of ``world`` ranks, two steps replayed on the first forward's inputs
  with a sum of the outputs as the loss; what the script's own loss adds over that replay, measured
  in one process, is added to the activations, and two of the largest unit's whole parameters to
  the communication buffers (a unit's gradients still in their reduce-scatter while the next unit
  is gathered).
- **ddp + AC**, **fsdp + AC**: the ddp and fsdp rows less what checkpointing the script's repeated
  blocks (:func:`checkpoint_blocks`) saved in its second step, measured in one process by the
  probe (:func:`checkpoint_second_step`); absent when the script checkpoints already.
- **fsdp, offload** (GPU ranks only): the fsdp row with the state shard in host memory
  (:func:`offloaded`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer
from torch.utils._pytree import tree_flatten

from paratrain.config import RunConfig
from paratrain.plans.activation_checkpointing import apply_activation_checkpointing
from paratrain.runtime.plan_probe import Captured, categories

FIELDS = ("parameters", "gradients", "optimizer", "activations", "communication")
_NAMES = {
    "Parameter": "parameters",
    "Buffer": "parameters",
    "Gradient": "gradients",
    "Optstate": "optimizer",
    "Activation": "activations",
    "Temp": "activations",
    "Other": "activations",
}


@dataclass
class Breakdown:
    """One strategy's predicted peak on one rank, in bytes, split by what holds the memory."""

    strategy: str
    parameters: int = 0
    """Parameters and buffers (a rank's shard, plus whole units being gathered under fsdp)."""
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    """Saved activations and the temporaries of forward, backward and the optimizer step."""
    communication: int = 0
    """Buffers of the strategy's own: DDP's gradient buckets, collectives still in flight."""
    why: str = ""

    @property
    def total(self) -> int:
        return sum(getattr(self, name) for name in FIELDS)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total": self.total}

    @classmethod
    def of(cls, strategy: str, sizes: dict[str, int], why: str = "") -> Breakdown:
        """From MemTracker's categories (``Parameter``, ``Gradient``, ...)."""
        row = cls(strategy, why=why)
        for kind, size in sizes.items():
            if kind in _NAMES:
                name = _NAMES[kind]
                setattr(row, name, getattr(row, name) + size)
        return row


def one_process(captured: Captured, name: str) -> Breakdown:
    """The script's step in one process, steady state (the larger of the first step's peak and
    forward/backward's peak with the optimizer's state held)."""
    step = Breakdown.of(name, captured.step)
    held = Breakdown.of(name, captured.before_step)
    held.optimizer += captured.optimizer_state
    return held if held.total > step.total else step


def gradient_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def step_tracker() -> Any:
    """torch's ``MemTracker`` without its per-module statistics: the peak by category is what a
    plan needs, and a model called twice before its backward (a GAN's discriminator on real and
    fake batches) is beyond those statistics."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class StepTracker(MemTracker):  # type: ignore[no-untyped-call]
        def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
            pass

        def _post_fw_hook(self, module: nn.Module, inputs: Any, outputs: Any) -> None:
            pass

        def _pre_bw_hook(self, module: nn.Module, args: Any) -> None:
            pass

        def _post_bw_hook(self, module: nn.Module, args: Any) -> None:
            pass

        def reset_peak(self) -> None:
            """Start a new peak from what is held now (as entering the tracker does)."""
            self._peak_mem_snap = self.get_tracker_snapshot()
            self._peak_mem = {dev: snap["Total"] for dev, snap in self._peak_mem_snap.items()}

    return StepTracker()


BUCKET_BYTES = 25 * 2**20
"""DDP's default ``bucket_cap_mb``."""


def largest_bucket(model: nn.Module) -> int:
    """Bytes of DDP's largest gradient bucket: up to ``bucket_cap_mb``, or one larger gradient."""
    sizes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
    return max([min(sum(sizes), BUCKET_BYTES), *sizes], default=0)


def largest_unit(model: nn.Module, config: RunConfig) -> int:
    """Bytes of the largest fsdp unit's own parameters (those of no unit inside it), whole."""
    from paratrain.plans.module_policy import selected

    units = [*selected(model, config.fsdp_wrap), model]
    owner: dict[int, int] = {}
    for number, unit in enumerate(units):  # children before parents: the innermost unit owns
        for p in unit.parameters():
            owner.setdefault(id(p), number)
    sizes = [0] * len(units)
    for p in model.parameters():
        sizes[owner[id(p)]] += p.numel() * p.element_size()
    return max(sizes)


def replay(
    model: nn.Module,
    make_optimizer: Callable[[nn.Module], Optimizer],
    inputs: Any,
    *,
    grad_accum: int = 1,
) -> Breakdown:
    """Two steps of ``model`` on ``inputs`` (args, kwargs), each of ``grad_accum`` micro-batches
    (FSDP's gradient sync held back until the last, as paratrain's ``no_sync`` does), with a sum
    of the outputs as the loss, under a fresh MemTracker: the peak by category."""
    from torch.distributed.fsdp import FSDPModule

    args, kwargs = inputs
    tracker = step_tracker()
    optimizer = make_optimizer(model)
    tracker.track_external(model, optimizer)
    with tracker:
        for _ in range(2):
            for micro in range(grad_accum):
                if isinstance(model, FSDPModule):
                    model.set_requires_gradient_sync(micro == grad_accum - 1)
                outputs = tree_flatten(model(*args, **kwargs))[0]
                floats = [
                    t for t in outputs if isinstance(t, torch.Tensor) and t.is_floating_point()
                ]
                loss = torch.stack([t.float().sum() for t in floats]).sum()
                torch.autograd.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return Breakdown.of("replay", categories(tracker, "peak"))


def optimizer_like(optimizer: Optimizer) -> Callable[[nn.Module], Optimizer]:
    """A maker of an optimizer of the same class and settings over another model's parameters."""
    accepted = inspect.signature(type(optimizer)).parameters
    settings = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return lambda model: type(optimizer)(model.parameters(), **settings)


def plans(
    captured: Captured, *, world: int, config: RunConfig, accelerator: str
) -> list[Breakdown]:
    """Every strategy's breakdown for ``world`` ranks (see the module docstring)."""
    model = captured.model
    assert model is not None and captured.inputs is not None and captured.optimizers
    alone = "single" if accelerator == "cuda" else "cpu"
    single = one_process(captured, alone)
    single.why = "the script's step as measured (one process, no gradient sync)"
    if world == 1:
        return [single]
    rows = []
    grads = gradient_bytes(model)
    # DDP's buckets hold a copy of every gradient; while the last bucket's all-reduce is still in
    # flight at the optimizer step, one rank can hold one bucket more (seen on gloo).
    ddp = dataclasses.replace(single, strategy="ddp", communication=grads + largest_bucket(model))
    # DDP rebuilds its buckets in the order gradients arrived, at the second step's start: for a
    # moment the first buckets and the rebuilt ones are both held.
    rebuild = Breakdown.of("ddp", captured.after_step)
    rebuild.communication = 2 * grads
    if rebuild.total > ddp.total:
        ddp = rebuild
    ddp.why = "every rank holds the whole model, its gradients, optimizer state and DDP's buckets"
    rows.append(ddp)
    make_optimizer = optimizer_like(captured.optimizers[0])
    restore_classes()

    def replayed(on: nn.Module) -> Breakdown:
        return replay(on, make_optimizer, captured.inputs, grad_accum=config.grad_accum)

    baseline = replayed(model)
    # What the script's loss (and anything else of its step) holds beyond the replay's sum.
    extra = single.total - baseline.total
    # Collectives that complete in order free their buffers at once; on a real group one unit's
    # gradients can still be in their reduce-scatter while the next unit is gathered.
    in_flight = 2 * largest_unit(model, config)
    for reshard, name, why in (
        (True, "fsdp", "state sharded over the ranks; each unit gathered while it runs"),
        (False, "fsdp, no reshard", "state sharded; units stay gathered from forward to backward"),
    ):
        sharded = _sharded(
            model, world, dataclasses.replace(config, fsdp_reshard_after_forward=reshard)
        )
        row = replayed(sharded)
        row.strategy, row.why = name, why
        row.activations += extra
        row.communication += in_flight
        rows.append(row)
        model = sharded  # sharded once; the second variant only changes when units reshard
    if captured.checkpointed_step:
        # What checkpointing the blocks saved in the script's second step, in one process (the
        # same on a rank under any sharding).
        saved = max(single.total - Breakdown.of("", captured.checkpointed_step).total, 0)
        recomputed = f"{len(captured.checkpointed)} blocks' activations recomputed in backward"
        for row, name in ((rows[0], "ddp + AC"), (rows[1], "fsdp + AC")):
            rows.append(
                dataclasses.replace(
                    row,
                    strategy=name,
                    activations=max(row.activations - saved, 0),
                    why=f"as {row.strategy}, {recomputed} (about a third more compute)",
                )
            )
    if accelerator == "cuda":
        rows.append(offloaded(rows[1], grads // world))
    return rows


def checkpoint_second_step(model: nn.Module, config: RunConfig) -> list[str]:
    """The probe's ``checkpoint``: unless the script checkpoints already, checkpoint the
    :func:`checkpoint_blocks` of ``model`` for its second step; their names. :func:`plans` gives
    them their own classes back before it replays the model."""
    if config.activation_checkpointing:
        return []
    blocks = checkpoint_blocks(model, config)
    chosen = [m for name, m in model.named_modules() if name in set(blocks)]
    _ORIGINAL_CLASSES.update({id(m): (m, type(m)) for m in chosen})
    apply_activation_checkpointing(model, lambda m: any(m is c for c in chosen))
    return blocks


_ORIGINAL_CLASSES: dict[int, tuple[nn.Module, type[nn.Module]]] = {}


def restore_classes() -> None:
    """Undo :func:`checkpoint_second_step` (the replays run the model as the script built it)."""
    for module, cls in _ORIGINAL_CLASSES.values():
        module.__class__ = cls
    _ORIGINAL_CLASSES.clear()


def offloaded(fsdp: Breakdown, shard: int) -> Breakdown:
    """``fsdp_offload`` (CUDA): the fsdp row with each rank's parameter shard, gradient shard
    (``shard`` bytes each) and optimizer state held in host memory; on the device remain the
    units gathered to run, the activations and the collectives' buffers."""
    host = 2 * shard + fsdp.optimizer
    return dataclasses.replace(
        fsdp,
        strategy="fsdp, offload",
        parameters=max(fsdp.parameters - shard, 0),
        gradients=max(fsdp.gradients - shard, 0),
        optimizer=0,
        why=(
            f"as fsdp, with the state shard ({host / 2**30:.2f} GiB per rank) in host memory; "
            "the optimizer steps on the CPU"
        ),
    )


def checkpoint_blocks(model: nn.Module, config: RunConfig) -> list[str]:
    """Names of the submodules the plan's activation-checkpointing rows recompute: the script's
    fsdp units, else its repeated blocks (the class with two or more instances, each holding
    parameters and submodules, that holds the most parameters; the outermost of each)."""
    from paratrain.plans.module_policy import selected

    names = {id(m): name for name, m in model.named_modules()}
    if config.fsdp_wrap:
        return [names[id(m)] for m in selected(model, config.fsdp_wrap) if id(m) in names]
    held: dict[type[nn.Module], list[nn.Module]] = {}
    for module in model.modules():
        composite = next(module.children(), None) is not None
        if module is not model and composite and next(module.parameters(), None) is not None:
            held.setdefault(type(module), []).append(module)
    repeated = {cls: found for cls, found in held.items() if len(found) >= 2}
    if not repeated:
        return []

    def weight(found: list[nn.Module]) -> int:
        return sum(p.numel() for m in found for p in m.parameters())

    def depth(found: list[nn.Module]) -> int:
        return min(str(names[id(m)]).count(".") for m in found)

    # The heaviest class; of two as heavy (a block and the one submodule it wraps), the outer.
    found = max(repeated.values(), key=lambda found: (weight(found), -depth(found)))
    inner = {id(sub) for m in found for sub in m.modules() if sub is not m}
    return [names[id(m)] for m in found if id(m) not in inner]


def _sharded(model: nn.Module, world: int, config: RunConfig) -> nn.Module:
    """``model`` under paratrain's fsdp units over a fake group of ``world`` ranks (rank 0)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from paratrain.strategies.fsdp import shard

    if isinstance(model, FSDPModule):
        for module in model.modules():
            if isinstance(module, FSDPModule) and module is not model:
                module.set_reshard_after_forward(config.fsdp_reshard_after_forward, recurse=False)
        return model
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    with unset_fake_temporarily():
        mesh = init_device_mesh("cpu", (world,))
    return shard(model, mesh, config)


def recommend(rows: list[Breakdown], capacity: int | None) -> tuple[Breakdown | None, str]:
    """The strategy to use and why: the first that fits ``capacity`` bytes in the order ddp
    (fastest: no gathers), fsdp without reshard, fsdp, then with activations recomputed (ddp,
    fsdp), then fsdp with its state in host memory; without a capacity, the smallest."""
    if capacity is None:
        best = min(rows, key=lambda r: r.total)
        return best, f"{best.strategy} has the smallest peak per rank"
    order = {"cpu": 0, "single": 0, "ddp": 1, "fsdp, no reshard": 2, "fsdp": 3, "ddp + AC": 4,
             "fsdp + AC": 5, "fsdp, offload": 6}  # fmt: skip
    fitting = sorted(
        (r for r in rows if r.total <= capacity), key=lambda r: order.get(r.strategy, 9)
    )
    if fitting:
        best = fitting[0]
        return best, (
            f"{best.strategy} fits ({best.total / 2**30:.2f} of {capacity / 2**30:.2f} GiB) and "
            "is the fastest of those that fit (no gathers before gathers, no recompute before "
            "recompute, host offload last)"
        )
    smallest = min(rows, key=lambda r: r.total)
    share = smallest.activations / max(smallest.total, 1)
    return None, (
        f"no strategy fits {capacity / 2**30:.2f} GiB; the smallest peak is {smallest.strategy}'s "
        f"{smallest.total / 2**30:.2f} GiB, {share:.0%} of it activations: lower the per-rank "
        "batch (raise grad_accum to keep the global batch) or checkpoint activations"
    )
