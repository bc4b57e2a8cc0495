"""``paratrain.launch``: run a function on N local ranks, from a script, a test or Jupyter.

    def train(lr: float) -> float:
        with pt.Run(strategy="ddp") as run:      # topology comes from the launcher
            ...
            return final_loss

    loss = paratrain.launch(train, nproc=2, args=(3e-4,))   # rank 0's return value

Each rank is a fresh process with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT set (a free
loopback port), so the function body is the same as under torchrun. A rank that raises ends the
launch with :class:`RankFailedError` naming the rank and carrying its traceback. Functions defined
in a notebook cannot be pickled for a spawned process; they run in forked processes instead (CPU
only: CUDA cannot be used after a fork, and the error says so).
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import sys
import traceback
from collections.abc import Callable
from typing import Any

from paratrain.errors import ParatrainError
from paratrain.ports import free_port


class RankFailedError(RuntimeError):
    """A rank of :func:`launch` raised; the message names it and holds its traceback."""

    def __init__(self, rank: int, details: str) -> None:
        super().__init__(f"rank {rank} failed:\n{details}")
        self.rank = rank


def _worker(
    rank: int, nproc: int, port: int, fn: Callable[..., Any], args: tuple[Any, ...], out: Any
) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch

        value = fn(*args)
        buffer = io.BytesIO()
        torch.save(value, buffer)
        out.put((rank, True, buffer.getvalue()))
    except BaseException:
        out.put((rank, False, traceback.format_exc()))


def _root_cause(errors: dict[int, str]) -> int:
    """The failing rank whose error is not just a peer having gone away."""
    secondary = ("Connection closed by peer", "remote worker", "Connection reset")
    primary = [r for r, text in errors.items() if not any(s in text for s in secondary)]
    return min(primary or errors)


def _context(fn: Callable[..., Any]) -> Any:
    main = sys.modules.get("__main__")
    interactive = fn.__module__ == "__main__" and not hasattr(main, "__file__")
    if not interactive:
        return mp.get_context("spawn")
    import torch

    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        raise ParatrainError(
            "paratrain.launch was given a function defined in this notebook after CUDA was "
            "initialised; such a function can only run in forked processes, where CUDA does "
            "not work. Move the function into a .py module and import it, or restart the "
            "kernel and call launch before touching CUDA."
        )
    return mp.get_context("fork")


def launch(
    fn: Callable[..., Any], nproc: int = 2, args: tuple[Any, ...] = (), *, timeout_s: float = 600.0
) -> Any:
    """Run ``fn(*args)`` on ``nproc`` local ranks; return rank 0's result."""
    if nproc < 1:
        raise ParatrainError(f"nproc must be >= 1, got {nproc}.")
    ctx = _context(fn)
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, nproc, port, fn, args, out)) for r in range(nproc)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        while len(results) + len(errors) < nproc:
            rank, ok, payload = out.get(timeout=3.0 if errors else timeout_s)
            (results if ok else errors)[rank] = payload
    except queue.Empty:
        if not errors:
            missing = sorted(set(range(nproc)) - set(results))
            raise RankFailedError(
                missing[0], f"ranks {missing} gave no result within {timeout_s:.0f}s (hung?)"
            ) from None
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        rank = _root_cause(errors)
        raise RankFailedError(rank, errors[rank])
    import torch

    return torch.load(io.BytesIO(results[0]), weights_only=False)
