"""paratrain: PyTorch training on one or many GPUs (and machines), correct by default.

    import paratrain as pt

    with pt.Run(strategy="auto", precision="bf16") as run:
        model, optimizer = run.setup(model, optimizer)
        ...

See :class:`paratrain.Run` for the training loop, ``paratrain --help`` for the command line.
"""

from paratrain.checkpoint.loading import LoadReport, load_weights
from paratrain.config import RunConfig
from paratrain.data import ExactOnceSampler, to_device
from paratrain.errors import (
    CheckpointError,
    ConfigError,
    EnvironmentMismatchError,
    ModelError,
    ParatrainError,
)
from paratrain.run import Run
from paratrain.topology import Topology
from paratrain.version import __version__

__all__ = [
    "CheckpointError",
    "ConfigError",
    "EnvironmentMismatchError",
    "ExactOnceSampler",
    "LoadReport",
    "ModelError",
    "ParatrainError",
    "Run",
    "RunConfig",
    "Topology",
    "__version__",
    "load_weights",
    "to_device",
]
