"""``ddp``: DistributedDataParallel — one process per device, gradients all-reduced in buckets.

Options come from :class:`~paratrain.config.RunConfig`: ``sync_batchnorm`` (GPUs only: torch's
SyncBatchNorm has no CPU kernel), ``find_unused_parameters``, ``broadcast_buffers``,
``static_graph`` and ``comm_hook``: ``fp16``/``bf16`` gradient compression, or ``powersgd``
(PowerSGD: each bucket's gradient sent as a rank-``powersgd_rank`` product, the error carried
into the next step; the first ``powersgd_warmup`` steps all-reduce exactly).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any, ClassVar

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

from paratrain.config import RunConfig
from paratrain.distributed.topology import Topology
from paratrain.errors import ConfigError, EnvironmentMismatchError
from paratrain.strategies.base import ForwardsAttributes, Strategy, average_buffers

_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


def check_ranks_fit_gpus(name: str, topology: Topology, accelerator: str, gpus: int) -> None:
    """One process per GPU: more local ranks than visible GPUs is an error, not oversubscription."""
    if accelerator == "cuda" and topology.local_world_size > gpus:
        raise EnvironmentMismatchError(
            f"strategy {name!r}: {topology.local_world_size} ranks on this machine but only {gpus} "
            f"GPU(s) visible; each rank needs its own GPU. Launch with `--nproc {gpus}` (or "
            "`--nproc auto`), or use accelerator='cpu' for CPU ranks."
        )


def _buffer_sync(enabled: bool) -> dict[str, Any]:
    # torch 2.13 renamed broadcast_buffers to forward_sync_buffers (and always syncs at init).
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    key = "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"
    return {key: enabled}


class DDPModule(ForwardsAttributes, DistributedDataParallel):
    """DistributedDataParallel that answers the wrapped module's own attributes and methods."""


class DDPStrategy(Strategy):
    """Wrap the model in DistributedDataParallel on this rank's device."""

    name: ClassVar[str] = "ddp"
    multi_process: ClassVar[bool] = True

    @classmethod
    def check(cls, config: RunConfig, topology: Topology, accelerator: str, gpus: int) -> None:
        super().check(config, topology, accelerator, gpus)
        check_ranks_fit_gpus(cls.name, topology, accelerator, gpus)
        powersgd_set = (config.powersgd_rank, config.powersgd_warmup) != (1, 10)
        if powersgd_set and config.comm_hook != "powersgd":
            raise ConfigError(
                "powersgd_rank / powersgd_warmup are set but comm_hook is "
                f"{config.comm_hook!r}: they only apply to comm_hook='powersgd'. Add "
                "comm_hook='powersgd', or drop them."
            )

    def wrap(self, model: nn.Module) -> nn.Module:
        return self._wrap(model, split=False)

    def wrap_split(self, model: nn.Module, devices: set[Any]) -> nn.Module:
        """A multi-device model stays where it is; DDP then takes no ``device_ids``."""
        return self._wrap(model, split=True)

    def _wrap(self, model: nn.Module, *, split: bool) -> nn.Module:
        if self.config.sync_batchnorm:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]
        if not split:
            model = model.to(self.device)
        ddp = DDPModule(
            model,
            device_ids=[self.device.index] if self.device.type == "cuda" and not split else None,
            find_unused_parameters=self.config.find_unused_parameters,
            **_buffer_sync(self.config.broadcast_buffers),
            static_graph=self.config.static_graph,
        )
        if self.config.comm_hook == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=self.config.powersgd_rank,
                start_powerSGD_iter=self.config.powersgd_warmup,
            )
            ddp.register_comm_hook(state=state, hook=powerSGD_hook.powerSGD_hook)
        elif self.config.comm_hook is not None:
            ddp.register_comm_hook(state=None, hook=_HOOKS[self.config.comm_hook])
        return ddp

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def sync_buffers(self, model: nn.Module) -> None:
        if not self.config.broadcast_buffers:  # else DDP copies rank 0's on every forward
            average_buffers(self.unwrap(model))

    def uneven_inputs(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        # Join shadows the collectives of ranks that ran out of batches until all are done.
        return (
            Join([model])
            if isinstance(model, DistributedDataParallel)
            else super().uneven_inputs(model)
        )

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        if isinstance(model, DistributedDataParallel):
            with model.no_sync():
                yield
        else:
            yield
