"""Run a function on N real gloo ranks (fresh processes) and collect what each returns.

    results = run_distributed(train_and_return_weights, 2, steps)   # [rank0_result, rank1_result]

The ranks are forked from a server process that imported torch and paratrain once (the
``forkserver`` start method with a preload), so a launch costs about 0.1 s instead of the 1.5-5 s
of importing torch in every rank; each rank then takes the test's current environment, working
directory and ``sys.path`` (a forkserver's children would otherwise see the server's).
They come from paratrain's own spawner (:func:`paratrain.distributed.ranks.spawn_ranks`):
rendezvous through a file (no ports to collide), one thread per rank, a collective timeout of
60 s, child tracebacks re-raised as ``RankFailedError`` naming the rank, a rank that dies without
raising named within a second, hung ranks killed and named. Results travel as ``torch.save``
bytes so tensors survive the child's exit.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from typing import Any

from paratrain.distributed.ranks import FileGroup, spawn_ranks
from paratrain.distributed.topology import Topology

PRELOAD = ["torch", "torch.distributed", "paratrain", "paratrain.runtime.run", "tests.support"]
"""What the rank server imports once; every rank starts with it loaded."""
multiprocessing.set_forkserver_preload(PRELOAD)


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
    context = (dict(os.environ), os.getcwd(), list(sys.path), os.getpid())
    return spawn_ranks(
        _as_in_the_test,
        world_size,
        (context, fn, args),
        start_method="forkserver",
        group=FileGroup(backend="gloo", timeout_s=60.0, destroy=not exit_hard),
        timeout_s=timeout,
        threads=1,
    )


def _as_in_the_test(
    context: tuple[dict[str, str], str, list[str], int],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> Any:
    """In a rank: the test's environment, working directory, import path and standard output
    and error (where pytest's ``capfd`` reads them), then ``fn``."""
    environ, cwd, path, test_pid = context
    for fd in (1, 2):
        _write_where_the_test_does(test_pid, fd)
    omp = os.environ.get("OMP_NUM_THREADS", "1")
    os.environ.clear()
    os.environ.update(environ)
    os.environ.setdefault("OMP_NUM_THREADS", omp)
    os.chdir(cwd)
    sys.path[:] = path
    return fn(*args)


def _write_where_the_test_does(test_pid: int, fd: int) -> None:
    """Point this process's ``fd`` at the test process's (a file, pipe or terminal; Linux)."""
    try:
        target = os.open(f"/proc/{test_pid}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
    except OSError:
        return  # a socket, or no /proc: the rank keeps the server's output
    (sys.stdout if fd == 1 else sys.stderr).flush()
    os.dup2(target, fd)
    os.close(target)
