"""The one protocol every strategy implements.

A strategy places the model on its device, wraps it for synchronisation, knows how to skip gradient
sync for accumulation micro-batches, and how to give back the plain model and its full weights.
Subclasses declare what they need (``needs_cuda``, ``multi_process``); the shared checks below turn
impossible combinations into errors that name the fix.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from paratrain.config import RunConfig
from paratrain.distributed.topology import Topology
from paratrain.errors import ConfigError, EnvironmentMismatchError, ModelError
from paratrain.plans.mesh import MeshShape


class ForwardsAttributes(nn.Module):
    """Base of a wrapper that holds the user's module as ``self.module`` (DDP, DataParallel):
    the module's own attributes and methods read through the wrapper, as in one process.

        model = run.setup(RNNModel(...))      # a DistributedDataParallel under ddp
        hidden = model.init_hidden(bsz)       # the RNNModel's method, not an AttributeError

    Only what the wrapper itself lacks is looked up in the module: ``model.module``,
    ``no_sync`` and the wrapper's own attributes keep their meaning.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("module")
            if inner is None or name.startswith("__"):
                raise
            return getattr(inner, name)


class Strategy:
    """Base class: single-device behaviour, overridden where a strategy differs."""

    name: ClassVar[str] = "base"
    needs_cuda: ClassVar[bool] = False
    """True when the strategy cannot run without a GPU."""
    multi_process: ClassVar[bool] = False
    """True when every rank is its own process: needs a process group and sharded data."""
    sharded_state: ClassVar[bool] = False
    """True when no rank holds the full state: checkpoints are written by every rank (DCP)."""
    partial_model: ClassVar[bool] = False
    """True when a rank holds only some layers (pipeline stages): optimizers keep those."""

    def __init__(self, *, config: RunConfig, topology: Topology, device: torch.device) -> None:
        self.config = config
        self.topology = topology
        self.device = device
        self.shape = self.mesh_shape(config, topology)
        """Mesh axes of this run (every rank on ``dp`` unless the strategy reads ``mesh``)."""
        self.notes: list[str] = []
        """Lines for the main process to print after ``wrap`` (what a plan chose)."""

    @classmethod
    def mesh_shape(cls, config: RunConfig, topology: Topology) -> MeshShape:
        """The mesh this strategy runs on; strategies that read ``config.mesh`` override it."""
        return MeshShape.resolve(None, topology.world_size)

    def recorded_mesh(self) -> dict[str, int] | None:
        """The mesh a checkpoint records: None when every rank is on ``dp`` (formats 1-4)."""
        sizes = self.shape.sizes
        if sizes["pp"] == 1 and sizes["tp"] == 1 and sizes["dp_replicate"] == 1:
            return None
        return self.shape.recorded()

    @property
    def data_rank(self) -> int:
        """Which share of the data this rank reads (ranks of one pipeline or tp group share one)."""
        return self.shape.data_rank(self.topology.rank)

    @property
    def data_size(self) -> int:
        """How many different shares the data is split into (world size without pp and tp)."""
        return self.shape.data_size

    @classmethod
    def check(cls, config: RunConfig, topology: Topology, accelerator: str, gpus: int) -> None:
        """Raise when this strategy cannot run as configured on this machine."""
        cls.mesh_shape(config, topology)  # the mesh arithmetic first: it names the world size
        if cls.needs_cuda and accelerator != "cuda":
            asked = config.accelerator if config.accelerator != "auto" else accelerator + "-auto"
            raise EnvironmentMismatchError(
                f"strategy {cls.name!r} needs CUDA GPUs, but {_no_gpu_reason(asked)}. "
                "Use strategy='cpu' (one process) or 'ddp' (several CPU ranks over gloo), or run "
                "on a GPU machine; `paratrain doctor` explains what torch sees."
            )
        if not cls.multi_process and topology.world_size > 1:
            raise ConfigError(
                f"strategy {cls.name!r} runs in one process, but this job has "
                f"{topology.world_size} ranks (launched by {topology.source}). Use strategy='ddp' "
                "or 'fsdp' (or 'auto'), or launch a single process."
            )
        if config.sync_batchnorm and not cls.multi_process:
            raise ConfigError(
                f"sync_batchnorm=True with strategy {cls.name!r}: SyncBatchNorm synchronises "
                "statistics across a process group, which a single process does not have (with "
                "DataParallel it silently does nothing). Use strategy='ddp' on GPUs, or drop "
                "sync_batchnorm."
            )
        if config.sync_batchnorm and accelerator != "cuda":
            raise ConfigError(
                f"sync_batchnorm=True on CPU ranks (strategy {cls.name!r}): torch's SyncBatchNorm "
                "runs on GPUs only and would fail at the first forward. Drop sync_batchnorm (each "
                "rank then normalises over its own per-rank batch) or train on GPUs."
            )

    @classmethod
    def device_for(cls, topology: Topology, accelerator: str, config: RunConfig) -> torch.device:
        """The device this rank computes on: ``cuda:<local rank>`` or ``cpu``."""
        if accelerator == "cuda":
            return torch.device("cuda", topology.local_rank)
        return torch.device("cpu")

    def wrap(self, model: nn.Module) -> nn.Module:
        """Move ``model`` to the device and wrap it for this strategy (a model already there is
        left as it is: ``paratrain plan``'s fake tensors cannot be swapped by ``Module.to``)."""
        tensors = itertools.chain(model.parameters(), model.buffers())
        if all(t.device == self.device for t in tensors):
            return model
        return model.to(self.device)

    def wrap_split(self, model: nn.Module, devices: set[torch.device]) -> nn.Module:
        """Wrap a model the user already spread over several devices, without moving it.

        Only DDP can (one process per model copy); the others refuse rather than collapse it."""
        listed = ", ".join(sorted(str(d) for d in devices))
        raise ModelError(
            f"The model is split over several devices ({listed}); strategy {self.name!r} would "
            "move all of it to one device and undo the split. Use strategy='ddp' (it keeps each "
            "layer where you put it: one process per model copy), or put the model on one "
            "device before run.setup."
        )

    loss_parallel: bool = False
    """True when the model's logits stay split over ranks (``tp`` with an ``output`` layer):
    losses and their backward run inside :meth:`loss_context`."""

    def loss_context(self) -> contextlib.AbstractContextManager[Any]:
        """Where a loss on this strategy's outputs is computed and back-propagated."""
        return contextlib.nullcontext()

    def check_batch(self, batch_size: int, last: int | None) -> None:
        """Raise when a loader's per-rank batches (``last``: a short final one) cannot run."""

    def sync_buffers(self, model: nn.Module) -> None:
        """Make buffers (BatchNorm statistics) agree across ranks before evaluation and saves.

        One process, and DDP with buffer sync, have nothing to do."""

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever wrapper :meth:`wrap` added."""
        return model

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Skip gradient synchronisation for the backward passes run inside."""
        yield

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """A CPU copy of the complete, unprefixed weights (complete on the main process)."""
        from paratrain.checkpoint.loading import strip_wrappers

        unwrapped = self.unwrap(model)
        state = unwrapped.state_dict()
        return {strip_wrappers(k): v for k, v in cpu_copies(state, unwrapped).items()}

    def clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        """Clip the global gradient norm of ``params``; return the norm before clipping."""
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(norm)

    def uneven_inputs(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Context for loops whose ranks see different numbers of batches (one process: no-op)."""
        return contextlib.nullcontext()


def cpu_copies(state: Mapping[str, Any], model: nn.Module | None = None) -> dict[str, Any]:
    """CPU copies of the tensors of ``state`` (other values, e.g. a module's ``_extra_state``,
    as they are). Tied entries stay one tensor, so a saved file holds them once: entries that
    view the same memory the same way, and the names ``model`` gives one parameter (a GPT's
    embedding and output layer), which FSDP's full state dict hands back as separate copies."""
    copies: dict[tuple[Any, ...], torch.Tensor] = {}
    out: dict[str, Any] = {}
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            out[name] = value
            continue
        if value.layout != torch.strided or value.is_conj() or value.is_neg():
            out[name] = value.detach().to("cpu", copy=True)  # no storage to share
            continue
        key = (
            value.untyped_storage().data_ptr(),
            value.device,
            value.dtype,
            value.storage_offset(),
            tuple(value.shape),
            value.stride(),
        )
        if key not in copies or value.numel() == 0:
            copies[key] = value.detach().to("cpu", copy=True)
        out[name] = copies[key]
    for names in tied_names(model) if model is not None else ():
        present = [n for n in names if n in out]
        for name in present[1:]:
            if torch.equal(out[name], out[present[0]]):
                out[name] = out[present[0]]
    return out


def tied_names(model: nn.Module) -> list[list[str]]:
    """Groups of names under which ``model`` holds one parameter or buffer (ties), with and
    without wrapper prefixes (``_orig_mod.``, ``_checkpoint_wrapped_module.``)."""
    from paratrain.checkpoint.loading import strip_wrappers

    by_object: dict[int, list[str]] = {}
    for name, tensor in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        by_object.setdefault(id(tensor), []).extend(dict.fromkeys([name, strip_wrappers(name)]))
    return [names for names in by_object.values() if len(set(map(strip_wrappers, names))) > 1]


def _no_gpu_reason(accelerator: str) -> str:
    if accelerator == "cpu":
        return "accelerator='cpu' was chosen"
    if accelerator == "cpu-auto":
        return _no_gpu_reason("cuda") + " (accelerator='auto' chose the CPU)"
    build = (
        "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    )
    return f"torch {torch.__version__} ({build}) sees no GPU"


def require_cuda(what: str, accelerator: str) -> None:
    """Raise the standard no-GPU error for ``what`` (e.g. ``"backend 'nccl'"``)."""
    if accelerator != "cuda":
        raise EnvironmentMismatchError(
            f"{what} needs CUDA GPUs, but {_no_gpu_reason(accelerator)}. Use the CPU equivalent "
            "(backend='gloo', accelerator='cpu') or run on a GPU machine; `paratrain doctor` "
            "explains what torch sees."
        )


def average_buffers(model: nn.Module, group: Any = None) -> None:
    """Average floating-point buffers over the ranks of ``group`` (default all; integer ones,
    e.g. counters, take the group's first rank's)."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size(group) > 1):
        return
    first = dist.get_global_rank(group, 0) if group is not None else 0
    for buffer in model.buffers():
        if buffer.is_floating_point():
            dist.all_reduce(buffer.data, op=dist.ReduceOp.SUM, group=group)
            buffer.data.div_(dist.get_world_size(group))
        else:
            dist.broadcast(buffer.data, src=first, group=group)
