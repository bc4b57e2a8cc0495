"""Start N local rank processes, collect what each returns, and name the rank that failed.

The one rank spawner of paratrain: :func:`paratrain.launch`, ``paratrain bench``, the doctor's
all-reduce measurement and the test harness all start their ranks here::

    # env rendezvous: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT set; the body (pt.Run) joins
    results = spawn_ranks(train, 2, args=(3e-4,))              # [rank 0's value, rank 1's value]

    # file rendezvous: every rank joins a gloo group before ``body`` runs, and leaves it after
    results = spawn_ranks(measure, 2, group=FileGroup(backend="gloo"), start_method="fork")

A rank that raises, or dies without raising (``os._exit``, SIGKILL, the OOM killer), ends the
spawn within about a second with :class:`RankFailedError`, which names the root-cause rank: the
first that failed on its own rather than because a peer went away. Ranks that give no result
within ``timeout_s`` print their stacks (faulthandler, SIGUSR1), are killed and named.
Values travel as ``torch.save`` bytes when the rank imported torch (tensors survive the rank's
exit), else as pickles.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import io
import math
import multiprocessing as mp
import os
import pickle
import queue
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from paratrain.distributed.ports import free_port
from paratrain.errors import PEER_LOST

POLL_S = 0.2
"""How often the parent checks for a rank that died without a word."""
SECONDARY_ERRORS = PEER_LOST
"""Error texts of a rank that failed because a peer went away, not on its own."""


class RankFailedError(RuntimeError):
    """A rank raised, died or hung; the message names it and holds its traceback or exit."""

    def __init__(self, rank: int, details: str, *, exitcode: int | None = None) -> None:
        super().__init__(f"rank {rank} failed:\n{details}")
        self.rank = rank
        """The root-cause rank."""
        self.exitcode = exitcode
        """Its process exit code (negative: the signal that killed it); None when it raised."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FileGroup:
    """Each rank joins a process group through a file before the body runs (no port to collide)."""

    backend: str = "gloo"
    """``gloo`` (CPU) or ``nccl`` (each rank then uses ``cuda:<rank % GPUs>``)."""
    timeout_s: float = 60.0
    """Timeout of every collective."""
    destroy: bool = True
    """False: end the rank with ``os._exit(0)`` after reporting, without tearing the group down
    (for bodies that leave collectives unmatched on purpose, where that would wait forever)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """One rank's failure as the parent saw it."""

    rank: int
    details: str
    """Its traceback, or how its process ended."""
    exitcode: int | None = None
    """Set when the process ended without reporting."""
    secondary: bool = field(default=False)
    """True when the error only says that a peer went away."""


def describe_exit(exitcode: int) -> str:
    """``"was killed by SIGKILL"`` / ``"exited with code 3"`` for a process exit code."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = (
            " (often the kernel's out-of-memory killer: check `dmesg`)" if name == "SIGKILL" else ""
        )
        return f"was killed by {name}{hint}"
    return f"exited with code {exitcode}"


def root_cause(failures: Sequence[Failure]) -> Failure:
    """The first failure (in the order observed) that is not just a peer having gone away."""
    primary = [f for f in failures if not f.secondary]
    return (primary or list(failures))[0]


def _encode(value: Any) -> tuple[str, bytes]:
    torch = sys.modules.get("torch")
    if torch is None:
        return "pickle", pickle.dumps(value)
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return "torch", buffer.getvalue()


def _decode(kind: str, payload: bytes) -> Any:
    if kind == "pickle":
        return pickle.loads(payload)
    import torch

    return torch.load(io.BytesIO(payload), weights_only=False)


def _join_group(rank: int, nproc: int, init_file: str, group: FileGroup) -> None:
    import torch
    import torch.distributed as dist

    if group.backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        group.backend,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=nproc,
        timeout=datetime.timedelta(seconds=group.timeout_s),
    )


def _worker(
    rank: int,
    nproc: int,
    env: dict[str, str],
    body: Callable[..., Any],
    args: tuple[Any, ...],
    out: Any,
    setup: tuple[FileGroup | None, str, int | None],
    send: bool,
) -> None:
    group, init_file, threads = setup
    os.environ.update(env)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent's "where are you?"
    # Ctrl-C reaches the whole process group: the parent alone reacts, and asks each rank to
    # save and stop (SIGTERM), so no rank dies in the middle of a step.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        if group is not None:
            _join_group(rank, nproc, init_file, group)
        value = body(*args)
        try:
            encoded = _encode(value if send else None)
        except Exception as err:
            raise RuntimeError(
                f"the function returned a {type(value).__name__} that cannot be sent back to "
                f"the caller ({err}); return plain data (numbers, strings, tensors, dicts)"
            ) from None
        out.put((rank, True, *encoded))
    except SystemExit as end:  # e.g. 75 from a preempted pt.Run: the process ends with it
        out.put((rank, False, "text", f"the rank exited with {end.code}".encode()))
        _leave_group(group, out)
        raise
    except BaseException:
        out.put((rank, False, "text", traceback.format_exc().encode()))
        _leave_group(group, out)
    else:
        _leave_group(group, out)


def _leave_group(group: FileGroup | None, out: Any) -> None:
    if group is None:
        return
    if not group.destroy:
        out.close()
        out.join_thread()
        os._exit(0)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_initialized():
        dist.destroy_process_group()


def spawn_ranks(
    body: Callable[..., Any],
    nproc: int,
    args: tuple[Any, ...] = (),
    *,
    start_method: str = "spawn",
    group: FileGroup | None = None,
    timeout_s: float | None = 600.0,
    threads: int | None = None,
    results: Literal["all", "main"] = "all",
    grace_s: float = 3.0,
) -> list[Any]:
    """Run ``body(*args)`` on ``nproc`` local ranks; return their values in rank order.

    ``start_method``: ``spawn`` (safe with CUDA and threads), or ``fork`` (starts in 0.1 s; CPU
    only, and for functions that cannot be pickled). ``group`` None: env rendezvous (the body
    creates the process group from RANK, WORLD_SIZE, MASTER_ADDR/PORT); a :class:`FileGroup`:
    every rank joins it first. ``timeout_s`` None waits as long as the ranks live.
    ``threads`` sets ``torch.set_num_threads`` in each rank. ``results="main"``: only rank 0
    sends its value (the others' entries are None). The first rank that fails on its own ends
    the spawn at once; a rank that failed only because a peer went away gives the others
    ``grace_s`` to show the root cause. The ranks still running are then killed.
    """
    ctx: Any = mp.get_context(start_method)
    out = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="paratrain-ranks-") as tmp:
        port = free_port() if group is None else 0
        setup = (group, os.path.join(tmp, "rendezvous"), threads)
        procs = [
            ctx.Process(
                target=_worker,
                args=(
                    rank,
                    nproc,
                    _rank_env(rank, nproc, port) if group is None else {},
                    body,
                    args,
                    out,
                    setup,
                    results == "all" or rank == 0,
                ),
                name=f"paratrain-rank{rank}",
            )
            for rank in range(nproc)
        ]
        for p in procs:
            p.start()
        try:
            values, failures, hung = _collect(procs, out, timeout_s, grace_s)
        except KeyboardInterrupt:  # Ctrl-C, or a notebook's interrupt: save, then stop
            _preempt(procs)
            raise
        except BaseException:  # leave no rank behind
            _stop(procs, patience_s=0.0)
            raise
        _stop(procs, patience_s=0.0 if failures or hung else 10.0)
    if failures:
        cause = root_cause(failures)
        raise RankFailedError(cause.rank, cause.details, exitcode=cause.exitcode)
    if hung:
        raise RankFailedError(
            hung[0],
            f"rank(s) {', '.join(map(str, hung))} gave no result within {timeout_s:.0f}s "
            "(hung?); their stacks are printed above and they were killed. Raise timeout_s if "
            "the work needs longer.",
        )
    return [values.get(rank) for rank in range(nproc)]


def _rank_env(rank: int, nproc: int, port: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _collect(
    procs: list[Any], out: Any, timeout_s: float | None, grace_s: float
) -> tuple[dict[int, Any], list[Failure], list[int]]:
    """Wait for every rank's value, error or death; return values, failures, hung ranks."""
    values: dict[int, Any] = {}
    failures: list[Failure] = []
    done: set[int] = set()
    deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
    while len(done) < len(procs) and time.monotonic() < deadline:
        try:
            rank, ok, kind, payload = out.get(timeout=POLL_S)
        except queue.Empty:
            # A rank reports before it exits: look at the exit codes first, then drain the
            # queue, so a rank that reported and ended is never taken for a dead one.
            dead = [r for r, p in enumerate(procs) if r not in done and p.exitcode is not None]
            _drain(out, done, values, failures)
            failures += [_death(r, procs[r].exitcode) for r in dead if r not in done]
            done.update(dead)
        else:
            done.add(rank)
            _record(rank, ok, kind, payload, values, failures)
        if failures and not all(f.secondary for f in failures):
            break  # the root cause is known: root_cause() takes the first own failure
        if failures:  # only peers-gone errors yet: give the cause a moment to show up
            deadline = min(deadline, time.monotonic() + grace_s)
    hung = [] if failures else sorted(set(range(len(procs))) - done)
    if hung:
        _dump_stacks([procs[r] for r in hung])
    return values, failures, hung


def _record(
    rank: int,
    ok: bool,
    kind: str,
    payload: bytes,
    values: dict[int, Any],
    failures: list[Failure],
) -> None:
    if ok:
        values[rank] = _decode(kind, payload)
        return
    text = payload.decode(errors="replace")
    failures.append(Failure(rank, text, secondary=any(s in text for s in SECONDARY_ERRORS)))


def _drain(out: Any, done: set[int], values: dict[int, Any], failures: list[Failure]) -> None:
    """Take what is already in the queue."""
    while True:
        try:
            rank, ok, kind, payload = out.get_nowait()
        except queue.Empty:
            return
        done.add(rank)
        _record(rank, ok, kind, payload, values, failures)


def _death(rank: int, exitcode: int) -> Failure:
    return Failure(
        rank,
        f"its process {describe_exit(exitcode)}, without a result or a Python exception from "
        "the function (its own output above may say why)",
        exitcode,
    )


def _dump_stacks(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive() and p.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGUSR1)
    time.sleep(0.5)


INTERRUPT_GRACE_S = 30.0
"""How long an interrupted spawn waits for its ranks to save (their ``preempt_grace_s`` is 25 s
by default)."""


def _preempt(procs: list[Any]) -> None:
    """Ask the ranks to stop as a scheduler would (SIGTERM: a ``pt.Run`` saves a checkpoint at
    its next safe point and exits with 75), wait for them, kill what is left. A second
    interrupt kills them at once."""
    print(
        "paratrain: interrupted: each rank saves a checkpoint at its next safe point and stops "
        "(interrupt again to stop at once)",
        file=sys.stderr,
        flush=True,
    )
    for p in procs:
        if p.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
    try:
        _stop(procs, patience_s=INTERRUPT_GRACE_S)
    except KeyboardInterrupt:
        _stop(procs, patience_s=0.0)
        raise
    if any(p.exitcode == 75 for p in procs):
        print(
            "paratrain: the ranks saved a checkpoint; run the same call again to resume",
            file=sys.stderr,
            flush=True,
        )


def _stop(procs: list[Any], *, patience_s: float) -> None:
    """Give the ranks ``patience_s`` to exit; kill the rest."""
    deadline = time.monotonic() + patience_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
