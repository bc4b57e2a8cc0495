"""Run a function on N real gloo ranks (spawned processes) and collect what each returns.

    results = run_distributed(train_and_return_weights, 2, steps)   # [rank0_result, rank1_result]

The ranks come from paratrain's own spawner (:func:`paratrain.launcher.ranks.spawn_ranks`):
rendezvous through a file (no ports to collide), one thread per rank, a collective timeout of
60 s, child tracebacks re-raised as ``RankFailedError`` naming the rank, a rank that dies without
raising named within a second, hung ranks killed and named. Results travel as ``torch.save``
bytes so tensors survive the child's exit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paratrain.distributed.topology import Topology
from paratrain.launcher.ranks import FileGroup, spawn_ranks


def rank_of_two() -> Topology:
    """Rank 0 of a 2-rank job on one machine, as a launcher would describe it (no group)."""
    return Topology(
        rank=0,
        local_rank=0,
        world_size=2,
        local_world_size=2,
        master_addr="127.0.0.1",
        master_port=1,
        source="test",
    )


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 180.0,
    exit_hard: bool = False,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` ranks; return the results in rank order.

    ``exit_hard``: end each rank without tearing the group down (for tests that leave
    collectives unmatched on purpose, where destroy_process_group would wait forever).
    """
    return spawn_ranks(
        fn,
        world_size,
        args,
        start_method="spawn",
        group=FileGroup(backend="gloo", timeout_s=60.0, destroy=not exit_hard),
        timeout_s=timeout,
        threads=1,
    )
