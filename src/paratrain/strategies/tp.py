"""``tp``: tensor parallel — layers split over the ``tp`` mesh axis, FSDP2 over the data axes.

    pt.Run(strategy="tp", tp_plan=pt.tp.mlp("mlp"))                      # every rank on tp
    pt.Run(strategy="tp", mesh={"dp": -1, "tp": 2}, tp_plan="auto")      # FSDP x TP (2-D)
    pt.Run(strategy="tp", mesh={"dp_replicate": 2, "dp": 2, "tp": 2}, tp_plan=plan)  # HSDP x TP

    notes = split_layers(model, tp.resolve(model, plan, 2), mesh["tp"])  # also in pipeline stages

``wrap`` gives every rank rank 0's initial weights, divides the head counts the plan names,
splits the planned layers with DTensor's ``parallelize_module`` over the ``tp`` axis, then, when
the data axes have more than one rank, shards everything with ``fully_shard`` over them (as
``fsdp`` does, with its ``fsdp_*`` options and bf16 ``MixedPrecisionPolicy``). Ranks of one tp
group read the same batch (``run.data_rank``) and share one random stream, so dropout on
activations they all hold stays identical. See :mod:`paratrain.tp` for plans.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from paratrain.config import RunConfig
from paratrain.distributed.topology import Topology
from paratrain.errors import ConfigError
from paratrain.plans import tp
from paratrain.plans.mesh import MeshShape
from paratrain.plans.tp_split import split
from paratrain.strategies.fsdp import MeshStrategy, place, shard


def split_layers(
    model: nn.Module, resolved: tp.Resolved, mesh: Any, *, what: str = ""
) -> list[str]:
    """Split ``model``'s layers by ``resolved`` (``tp.resolve(model, plan, size)``) over the tp
    ``mesh`` axis, checked first (see :mod:`paratrain.plans.tp_split`); returns notes to print.
    ``what`` names a pipeline stage in the notes."""
    size = int(mesh.size())
    skipped = split(model, resolved, mesh)
    styles = ", ".join(f"{n} {type(s).__name__}" for n, s in resolved.styles.items())
    notes = [f"paratrain: {what}tensor parallel over tp {size}: {styles or 'nothing'}", *skipped]
    for module, name, attr in resolved.heads:
        notes.append(
            f"paratrain: {name}.{attr} = {getattr(module, attr)} heads per rank (of "
            f"{getattr(module, attr) * size})"
        )
    return notes


class TensorParallelStrategy(MeshStrategy):
    """Split layers with a tensor-parallel plan; FSDP over the data-parallel axes, if any."""

    name: ClassVar[str] = "tp"

    @classmethod
    def mesh_shape(cls, config: RunConfig, topology: Topology) -> MeshShape:
        shape = MeshShape.resolve(config.mesh or {"tp": -1}, topology.world_size)
        if shape.sizes["pp"] > 1:
            raise ConfigError(
                f"mesh={config.mesh!r} has a pp axis, which strategy 'tp' does not pipeline. "
                "Use strategy='pipeline' for pipeline stages (with dp), or drop the pp axis."
            )
        if shape.sizes["tp"] == 1 and topology.world_size > 1:
            raise ConfigError(
                f"strategy 'tp' with mesh={config.mesh!r}: the tp axis has one rank, so nothing "
                "is split. Give tp a size, e.g. mesh={'dp': -1, 'tp': 2}, or use strategy="
                "'fsdp' for data parallelism alone."
            )
        return shape

    @classmethod
    def check(cls, config: RunConfig, topology: Topology, accelerator: str, gpus: int) -> None:
        super().check(config, topology, accelerator, gpus)
        if config.tp_plan is None:
            raise ConfigError(
                "strategy 'tp' needs tp_plan: which layers to split. Pass tp_plan='auto' (the "
                "MLPs paratrain can prove safe), paratrain.tp.mlp(...) | paratrain.tp.attention"
                "(...), or a dict of module name to 'colwise'/'rowwise'."
            )

    def wrap(self, model: nn.Module) -> nn.Module:
        model = place(model, self.device, sync_batchnorm=self.config.sync_batchnorm)
        mesh = self.shape.build(self.device.type)
        resolved = tp.resolve(model, self.config.tp_plan, self.shape.sizes["tp"])
        self.loss_parallel = resolved.loss_parallel
        self.notes.extend(split_layers(model, resolved, mesh["tp"]))
        if self.loss_parallel:
            self.notes.append(
                "paratrain: loss parallel: logits stay split over the classes; losses from "
                "loss_fn= or from the model's forward are computed on the shards"
            )
        data = self.shape.data_submesh(mesh)
        if data is not None:
            model = shard(model, data, self.config)
        return model

    def loss_context(self) -> contextlib.AbstractContextManager[Any]:
        if not self.loss_parallel:
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        return clip_by_global_norm(params, max_norm, device=self.device)


def clip_by_global_norm(
    params: list[torch.Tensor],
    max_norm: float,
    *,
    device: torch.device,
    per_stage: int | None = None,
) -> float:
    """Clip by the global norm when parameters live on different meshes (tp layers on the
    2-D mesh, the rest on the data axes, or plain tensors) or different ranks (pipeline stages,
    ``per_stage`` ranks each): one all-reduce of the summed squares, each copy counted once."""
    grads = [p.grad for p in params if p.grad is not None]
    world = dist.get_world_size() if dist.is_initialized() else 1
    holders = world if per_stage is None else per_stage  # ranks that hold one stage
    squares = torch.zeros((), dtype=torch.float64, device=device)
    for grad in grads:
        local, copies = _local_and_copies(grad, holders)
        norm = torch.linalg.vector_norm(local, dtype=torch.float64)
        squares += norm * norm / copies
    if world > 1:
        dist.all_reduce(squares)  # every rank joins, even one without gradients
    total = float(squares.sqrt())
    coefficient = max_norm / (total + 1e-6)
    if coefficient < 1.0:
        for grad in grads:
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            local.mul_(coefficient)
    return total


def _local_and_copies(grad: torch.Tensor, holders: int) -> tuple[torch.Tensor, float]:
    """This rank's part of ``grad`` and how many ranks hold an identical part (of the
    ``holders`` ranks that hold this parameter at all)."""
    if not isinstance(grad, DTensor):
        return grad, float(holders)  # a plain parameter: the same gradient on every holder
    mesh = grad.device_mesh
    replicated = math.prod(
        mesh.size(dim) for dim, p in enumerate(grad.placements) if isinstance(p, Replicate)
    )
    return grad.to_local(), float(replicated * holders // mesh.size())
