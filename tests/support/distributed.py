"""Run a function on N real gloo ranks (spawned processes) and collect what each returns.

    results = run_distributed(train_and_return_weights, 2, steps)   # [rank0_result, rank1_result]

Rendezvous through a file (no ports to collide), one thread per rank, a collective timeout of 60 s,
child tracebacks sent back and re-raised with the rank named, hung ranks killed and named.
Results travel as ``torch.save`` bytes so tensors survive the child's exit.
"""

from __future__ import annotations

import datetime
import io
import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def _worker_exit_hard(
    rank: int,
    world_size: int,
    init_file: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
) -> None:
    """Like _worker, but end the process without tearing the group down (for tests that leave
    collectives unmatched on purpose, where destroy_process_group would wait forever)."""
    _worker(rank, world_size, init_file, fn, args, results, destroy=False)
    results.close()
    results.join_thread()
    os._exit(0)


def _worker(
    rank: int,
    world_size: int,
    init_file: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
    destroy: bool = True,
) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=60),
        )
        value = fn(*args)
        buffer = io.BytesIO()
        torch.save(value, buffer)
        results.put((rank, "ok", buffer.getvalue()))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if destroy and dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 180.0,
    exit_hard: bool = False,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` ranks; return the results in rank order."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(
                target=_worker_exit_hard if exit_hard else _worker,
                args=(r, world_size, init_file, fn, args, results),
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        outcome: dict[int, tuple[str, Any]] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(outcome) < world_size:
                try:
                    rank, status, payload = results.get(timeout=1.0)
                except queue.Empty:
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                    if dead or time.monotonic() > deadline:
                        missing = sorted(set(range(world_size)) - set(outcome))
                        raise AssertionError(
                            f"ranks {missing} did not finish (exited early: {dead})"
                        ) from None
                    continue
                outcome[rank] = (status, payload)
                if status == "error":
                    break
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
                    p.join()
    for rank, (status, payload) in sorted(outcome.items()):
        if status == "error":
            raise AssertionError(f"rank {rank} failed:\n{payload}")
    return [torch.load(io.BytesIO(outcome[r][1]), weights_only=False) for r in range(world_size)]
