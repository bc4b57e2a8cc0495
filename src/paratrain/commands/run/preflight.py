"""Check settings the way every rank would, before any rank starts.

    selection = preflight(RunConfig(strategy="ddp", precision="bf16"), nproc=2, gpus=0)
    # ConfigError / EnvironmentMismatchError now, in the launching process, instead of the
    # same error from every rank after they started

``paratrain demo`` and ``paratrain bench`` call it before they launch ranks: the strategy is
selected for rank 0 of an ``nproc``-rank single-node job on this machine, and the precision is
checked on the device that strategy would use.
"""

from __future__ import annotations

from paratrain.config import RunConfig
from paratrain.distributed.topology import Topology
from paratrain.runtime.precision import Precision
from paratrain.strategies import Selection, select_strategy


def local_topology(nproc: int) -> Topology:
    """Rank 0 of an ``nproc``-rank job on this machine, as torchrun would describe it."""
    return Topology(
        rank=0,
        local_rank=0,
        world_size=nproc,
        local_world_size=nproc,
        master_addr="127.0.0.1",
        master_port=0,
        source="torchrun" if nproc > 1 else "none",
    )


def preflight(config: RunConfig, *, nproc: int, gpus: int) -> Selection:
    """The strategy rank 0 would select; raises what a rank would raise at start."""
    selection = select_strategy(config, local_topology(nproc), gpus)
    Precision(config.precision, selection.strategy.device)
    return selection
