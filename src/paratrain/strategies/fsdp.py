"""``fsdp``: FSDP2 (``fully_shard``) — parameters, gradients and optimizer state sharded over ranks.

    model = place(model, device, sync_batchnorm=False)  # rank 0's initial values everywhere
    model = shard(model, mesh["dp"], config)  # fully_shard each fsdp_wrap unit, then the root

The strategies over a mesh (``fsdp``, ``tp``, ``pipeline``) are siblings: each composes these
functions with :func:`paratrain.strategies.tp.split_layers` and the pipeline's stages in its
``wrap``, and :class:`MeshStrategy` holds what they share (gradient sync, buffers, state dicts).

Each submodule chosen by ``RunConfig.fsdp_wrap`` becomes its own all-gather unit (for a transformer:
its blocks), and the root module always is one. Works on CPU ranks over gloo as on GPUs over nccl.
FSDP2 shards each rank's local copy; ``wrap`` first broadcasts rank 0's initial weights so the
copies agree. Buffers (BatchNorm statistics) stay per rank while training and are averaged over
ranks before each evaluation pass and each save.

``mesh={"dp_replicate": r, "dp": s}`` is HSDP: each group of ``s`` ranks shards the state, and
the ``r`` groups hold replicas (gradients reduce-scattered within a group, all-reduced across).

``precision="bf16"`` uses FSDP2's ``MixedPrecisionPolicy``: parameters are all-gathered and
computed in bf16 (half the traffic and memory of the gathered copy), gradients reduced in fp32,
and the sharded fp32 parameters stay the optimizer's; autocast still runs the forward pass, so
losses and softmaxes stay in fp32 as with the other strategies. ``fsdp_reshard_after_forward``
(for every unit but the root, which backward needs first, as torch's default has it) and
``fsdp_offload`` (``CPUOffloadPolicy``, GPUs only) are passed to ``fully_shard``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from paratrain.config import RunConfig
from paratrain.distributed.topology import Topology
from paratrain.errors import ConfigError
from paratrain.plans.mesh import MeshShape
from paratrain.plans.module_policy import selected
from paratrain.strategies.base import Strategy, average_buffers, cpu_copies
from paratrain.strategies.ddp import check_ranks_fit_gpus
from paratrain.strategies.fsdp_methods import check_methods


def place(model: nn.Module, device: torch.device, *, sync_batchnorm: bool) -> nn.Module:
    """On this rank's device, with rank 0's initial values on every rank."""
    if sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]
    model = model.to(device)
    # FSDP2 shards each rank's local copy: make the copies equal first, whatever random
    # state each rank built its model with (rank 0's values win, as in DDP).
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)
    return model


def shard(model: nn.Module, mesh: DeviceMesh, config: RunConfig) -> nn.Module:
    """``fully_shard`` every ``fsdp_wrap`` unit and the root over ``mesh`` (2-D: HSDP)."""
    options: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": config.fsdp_reshard_after_forward,
        "offload_policy": CPUOffloadPolicy() if config.fsdp_offload else OffloadPolicy(),
    }
    if config.precision == "bf16":
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    if config.precision == "bf16" and mesh.device_type == "cpu":
        # torch's CPU batch norm wants its running statistics in the input's dtype: norm layers
        # run in fp32 (their inputs cast up, their outputs cast back to bf16), as on GPUs is
        # also the usual advice.
        norm = MixedPrecisionPolicy(
            param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=torch.bfloat16
        )
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module is not model:
                fully_shard(module, **{**options, "mp_policy": norm})
    for module in selected(model, config.fsdp_wrap):
        fully_shard(module, **options)
    # The root's parameters are the first backward needs: freeing them after forward would
    # only gather them again at once (torch's own default for a root; it was 8 % of a step
    # on the bench MLP).
    fully_shard(model, **{**options, "reshard_after_forward": False})
    check_methods(model)
    return model


class MeshStrategy(Strategy):
    """What the strategies over a device mesh share: one process per rank, sharded state,
    FSDP2's gradient sync, per-rank buffers averaged before evaluation and saves."""

    multi_process: ClassVar[bool] = True
    sharded_state: ClassVar[bool] = True

    @classmethod
    def check(cls, config: RunConfig, topology: Topology, accelerator: str, gpus: int) -> None:
        super().check(config, topology, accelerator, gpus)
        check_ranks_fit_gpus(cls.name, topology, accelerator, gpus)
        if config.fsdp_offload and accelerator != "cuda":
            raise ConfigError(
                "fsdp_offload=True on CPU ranks: it moves sharded state from GPU memory to host "
                "memory, where CPU ranks keep it already. Drop fsdp_offload, or train on GPUs."
            )

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        if not isinstance(model, FSDPModule):
            yield
            return
        # FSDP2 keeps unsharded gradients locally and reduce-scatters on the next synced backward.
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def sync_buffers(self, model: nn.Module) -> None:
        # Buffers are not sharded: each rank updated its own BatchNorm statistics.
        average_buffers(model)

    def uneven_inputs(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        raise ConfigError(
            f"uneven_inputs is not supported with strategy {self.name!r} (torch's Join covers "
            "DDP only). Use run.loader, which gives every rank the same number of batches, or "
            "strategy='ddp'."
        )

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        # Imported here: torch.distributed.checkpoint takes ~1 s to import, and the CLI (doctor)
        # should not pay for it. A collective: every rank must call it.
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)
        # On one CPU rank the "offloaded" tensors can alias the live parameters: copy them.
        return cpu_copies(state, model)

    def clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        # The norm of sharded (DTensor) gradients is itself a DTensor reduced over all ranks.
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        full = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        return float(full)


class FSDPStrategy(MeshStrategy):
    """Shard the model with ``fully_shard`` over the ``dp`` axis (HSDP with ``dp_replicate``)."""

    name: ClassVar[str] = "fsdp"

    @classmethod
    def mesh_shape(cls, config: RunConfig, topology: Topology) -> MeshShape:
        shape = MeshShape.resolve(config.mesh, topology.world_size)
        if shape.sizes["pp"] > 1:
            raise ConfigError(
                f"mesh={config.mesh!r} has a pp axis, which strategy 'fsdp' does not pipeline. "
                "Use strategy='pipeline' (stages over pp, FSDP over dp), or drop the pp axis."
            )
        if shape.sizes["tp"] > 1:
            raise ConfigError(
                f"mesh={config.mesh!r} has a tp axis, which strategy 'fsdp' does not split. Use "
                "strategy='tp' (tensor parallel over tp, FSDP over dp), or drop the tp axis."
            )
        return shape

    def wrap(self, model: nn.Module) -> nn.Module:
        model = place(model, self.device, sync_batchnorm=self.config.sync_batchnorm)
        mesh = self.shape.build(self.device.type)
        data = self.shape.data_submesh(mesh)
        assert data is not None or self.shape.world_size == 1
        return shard(model, data if data is not None else mesh["dp"], self.config)
