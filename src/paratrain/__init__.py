"""paratrain: PyTorch training on one or many GPUs (and machines), correct by default.

    import paratrain as pt

    with pt.Run(strategy="auto", precision="bf16") as run:
        model, optimizer = run.setup(model, optimizer)
        ...

See :class:`paratrain.Run` for the training loop, ``paratrain --help`` for the command line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from paratrain.core.version import __version__
from paratrain.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    EnvironmentMismatchError,
    ModelError,
    ParatrainError,
    StorageError,
)

if TYPE_CHECKING:
    from paratrain.checkpoint.loading import LoadReport, load_weights
    from paratrain.config import RunConfig
    from paratrain.data.loader import ExactOnceSampler, to_device
    from paratrain.distributed.spawn import RankFailedError, launch
    from paratrain.distributed.topology import Topology
    from paratrain.plans import tp
    from paratrain.profiling.step_profiler import Profile
    from paratrain.runtime.run import Run
    from paratrain.strategies.fsdp_methods import gathered

# Imported on first use, so that `paratrain doctor` runs (and reports) when torch is broken.
_LAZY = {
    "LoadReport": "paratrain.checkpoint.loading",
    "load_weights": "paratrain.checkpoint.loading",
    "RunConfig": "paratrain.config",
    "ExactOnceSampler": "paratrain.data.loader",
    "to_device": "paratrain.data.loader",
    "Run": "paratrain.runtime.run",
    "Profile": "paratrain.profiling.step_profiler",
    "launch": "paratrain.distributed.spawn",
    "RankFailedError": "paratrain.distributed.spawn",
    "Topology": "paratrain.distributed.topology",
    "gathered": "paratrain.strategies.fsdp_methods",
}


def __getattr__(name: str) -> Any:
    if name == "tp":  # tensor-parallel plans: pt.tp.mlp(...), pt.tp.attention(...)
        return importlib.import_module("paratrain.plans.tp")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'paratrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    """Every public name, the lazily imported ones (``Run``, ``launch``, ...) included."""
    return sorted({*globals(), *__all__})


__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "EnvironmentMismatchError",
    "ExactOnceSampler",
    "LoadReport",
    "ModelError",
    "ParatrainError",
    "Profile",
    "RankFailedError",
    "Run",
    "RunConfig",
    "StorageError",
    "Topology",
    "__version__",
    "gathered",
    "launch",
    "load_weights",
    "to_device",
    "tp",
]
