"""Fault injection for ``paratrain verify-resume``: a trace of loop events, and a chosen rank
that SIGKILLs itself at one of them. Off unless the launcher sets the variables.

    PARATRAIN_TRACE=DIR              each rank appends its events to DIR/rank<r>.jsonl
    PARATRAIN_KILL=step:5:1          on the first attempt, rank 1 SIGKILLs itself at its 5th step
    PARATRAIN_KILL=preempt:5:1       ... sends itself SIGTERM (preemption) at its 5th step

    recorder = faults.start(env, rank=run.rank, where=lambda: (loop.global_step, loop.epoch))
    faults.emit("step")              # the call sites: one line each, a no-op when off
    faults.stop(recorder)            # run.close()

An event is one JSON line, written and flushed before any kill::

    {"event": "step", "n": 5, "step": 5, "epoch": 0, "rank": 1, "restart": 0}

``n`` counts the events of that kind on this rank in this attempt, from 1. The kinds
(:data:`EVENTS`), in the order verify-resume prefers them:

``mid_window``   a micro-batch that does not end its accumulation window (``run.accumulate``
                 exits, its gradients held; only with ``grad_accum`` > 1)
``step``         just after an optimizer step (``run.step`` stepped; scheduler stepped too)
``saved``        right after ``run.save()`` returned
``save_write``   during a save's write: the checkpoint's files are written, its manifest (the
                 commit point) is not (the rank that commits: the main process)
``eval_batch``   a batch of an evaluation loader (``run.eval_loader``) arrived
``epoch``        ``run.epochs`` moved to the next epoch (``epoch`` is the new one)

The kill happens only on the first attempt (``TORCHELASTIC_RESTART_COUNT`` 0), so a run
launched with ``--max-restarts 1`` is restarted by torchrun and resumes by itself.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from paratrain.errors import ConfigError

EVENTS = ("mid_window", "step", "saved", "save_write", "eval_batch", "epoch")
"""Every event kind, in the order verify-resume prefers them as kill points."""

PREEMPT = "preempt"
"""A kill point that is no event of its own: at its N-th ``step`` event the rank sends itself
SIGTERM, a preemption signal, instead of SIGKILL (the run saves at its next safe point and exits
with 75, or dies of the signal where ``preempt_signals`` is off)."""


@dataclass(frozen=True, slots=True)
class KillPoint:
    """Where a rank kills itself: its ``n``-th event of kind ``event``."""

    event: str
    n: int
    rank: int

    def __str__(self) -> str:
        return f"{self.event}:{self.n}:{self.rank}"

    @classmethod
    def parse(cls, text: str, source: str = "PARATRAIN_KILL") -> KillPoint:
        """``"step:5:1"`` -> KillPoint("step", 5, 1); a ConfigError naming the format."""
        parts = text.split(":")
        event, n, rank = parts if len(parts) == 3 else ("", "", "")
        if event not in (*EVENTS, PREEMPT) or not n.isdigit() or not rank.isdigit() or int(n) < 1:
            raise ConfigError(
                f"{source}={text!r} is not EVENT:N:RANK (N counted from 1, RANK from 0; EVENT one "
                f"of {', '.join((*EVENTS, PREEMPT))}), e.g. step:5:1. Unset it, or let "
                "`paratrain verify-resume` set it."
            )
        return cls(event, int(n), int(rank))


class Recorder:
    """Writes this rank's events and kills the rank at its kill point."""

    def __init__(
        self,
        *,
        trace_dir: Path | None,
        kill: KillPoint | None,
        rank: int,
        restart: int,
        where: Callable[[], tuple[int, int]],
    ) -> None:
        self.rank = rank
        self.restart = restart
        self.where = where
        """``() -> (step, epoch)`` of the loop right now."""
        self.kill = kill if kill is not None and kill.rank == rank and restart == 0 else None
        self.counts = dict.fromkeys(EVENTS, 0)
        self._lock = threading.Lock()  # a background save writes from its own thread
        self._file: IO[str] | None = None
        if trace_dir is not None:
            trace_dir.mkdir(parents=True, exist_ok=True)
            self._file = (trace_dir / f"rank{rank}.jsonl").open("a", encoding="utf-8")

    def emit(self, event: str) -> None:
        """Record ``event``; at the kill point, SIGKILL this process (after the record)."""
        with self._lock:
            self.counts[event] += 1
            n = self.counts[event]
            if self._file is not None:
                step, epoch = self.where()
                record = {
                    "event": event,
                    "n": n,
                    "step": step,
                    "epoch": epoch,
                    "rank": self.rank,
                    "restart": self.restart,
                }
                self._file.write(json.dumps(record) + "\n")
                self._file.flush()
            kill = self.kill
            if kill is not None and kill.n == n and kill.event == event:
                sys.stdout.flush()
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            elif kill is not None and kill.n == n and kill.event == PREEMPT and event == "step":
                self.kill = None  # once: the run goes on to its next safe point
                os.kill(os.getpid(), signal.SIGTERM)

    def close(self) -> None:
        """Close the trace file."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


_active: Recorder | None = None


def start(
    *,
    trace_dir: str | None,
    kill: KillPoint | None,
    rank: int,
    restart: int,
    where: Callable[[], tuple[int, int]],
) -> Recorder | None:
    """Start recording for this process (None, and nothing recorded, when both are unset)."""
    global _active
    if trace_dir is None and kill is None:
        return None
    if _active is not None:
        _active.close()
    _active = Recorder(
        trace_dir=Path(trace_dir) if trace_dir else None,
        kill=kill,
        rank=rank,
        restart=restart,
        where=where,
    )
    return _active


def stop(recorder: Recorder | None) -> None:
    """Stop ``recorder`` (a no-op for None, or when another one replaced it)."""
    global _active
    if recorder is None:
        return
    recorder.close()
    if _active is recorder:
        _active = None


def emit(event: str) -> None:
    """Record ``event`` (one of :data:`EVENTS`) if recording is on; may not return (the kill)."""
    if _active is not None:
        _active.emit(event)
