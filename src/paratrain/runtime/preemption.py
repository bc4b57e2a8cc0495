"""Save when the scheduler says stop: a preemption signal becomes a checkpoint at the next safe
point, then the process exits with :data:`PREEMPTED_EXIT`.

    preemption = Preemption(("SIGTERM", "SIGUSR1"), grace_s=25.0, warn=console.warn)
    preemption.install()                   # main thread only; a second signal aborts at once
    ...
    if preemption.agreed(store, key, step, rank=rank, world=world):   # at each safe point
        preemption.start_deadline(step)    # the save is abandoned past the grace period
        ...save...

Kubernetes and Docker send SIGTERM and wait a grace period (30 s by default); Slurm sends
SIGTERM, or a chosen signal ahead of time (``--signal=USR1@90``). The signal may reach every
rank (torchrun passes its own on) or one rank only. So a rank that got it raises a flag in the
job's key-value store; every rank that sees the flag notes its step there, and once all have,
each stops at the safe point of the same step, a few steps past the latest noted one. No
collective is added to the training step. A safe point is where a save resumes exactly: before
the training loader hands out its next batch (no accumulation window open), or after an
optimizer step of a loop without ``run.loader``.

Reading the store is a network round trip (25 µs on one machine), so until the flag is up a rank
looks at it at most every :data:`CHECK_EVERY_S` seconds, not at every batch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

AHEAD = 3
"""Steps between the latest step a rank noted and the step every rank stops at (ranks are at
most one step apart, so each learns the stop step before it gets there)."""
CHECK_EVERY_S = 0.01
"""Seconds between two looks at the store's flag by one rank, until the flag is up."""
PREEMPTED_EXIT = 75
"""The exit code of a preempted process: "temporary failure, retry" (``EX_TEMPFAIL``). A
checkpoint at the step reached is committed (or, past the grace period, the previous one stays
the newest); running the same command again resumes. ``paratrain run`` exits with it too."""


class Preemption:
    """The preemption signals of one process, and the ranks' agreement on when to stop."""

    def __init__(
        self,
        signals: Iterable[str],
        *,
        grace_s: float,
        warn: Callable[[str], None],
        first: Callable[[FrameType | None], None] | None = None,
    ) -> None:
        self.signals = tuple(signal.Signals[name] for name in signals)
        self.first = first
        """Called with the interrupted frame at a signal, before anything else; may end the
        process (the watchdog's ``end_if_hang_named``: a job ended for a hang is no
        preemption)."""
        self.grace_s = grace_s
        self.warn = warn
        self.received: tuple[signal.Signals, float] | None = None
        """The first signal and when it came (monotonic seconds)."""
        self._previous: dict[signal.Signals, Any] = {}
        self._target: int | None = None
        self._flag_seen = False
        self._noted = False
        self._looked_at = -CHECK_EVERY_S
        self._deadline: threading.Timer | None = None

    def install(self) -> None:
        """Catch the signals that have no handler yet (only the main thread can). A signal the
        script or a library already handles (``faulthandler.register``, say) keeps its
        handler."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            if signal.getsignal(sig) is signal.SIG_DFL:
                self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        """Give the signals their previous handlers back, and stop the deadline."""
        for sig, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, previous)
        self._previous.clear()
        if self._deadline is not None:
            self._deadline.cancel()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self.first is not None:
            self.first(frame)
        if self.received is None:
            self.received = (sig, time.monotonic())
            print(
                f"paratrain: got {sig.name}: saving a checkpoint at the next safe point, then "
                f"exiting with {PREEMPTED_EXIT} (a second {sig.name} stops at once)",
                file=sys.stderr,
                flush=True,
            )
            return
        self.uninstall()  # a second signal: stop now, as if paratrain had not caught the first
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)

    def quiet(self, *, alone: bool) -> bool:
        """True when a safe point has nothing to do (no store read): no signal here and, with
        other ranks, no flag seen and the last look less than :data:`CHECK_EVERY_S` ago."""
        if self.received is not None or self._target is not None:
            return False
        if alone:
            return True
        return not self._flag_seen and time.monotonic() - self._looked_at < CHECK_EVERY_S

    def agreed(self, store: Any, key: str, step: int, *, rank: int = 0, world: int = 1) -> bool:
        """Whether this rank stops here, at optimizer step ``step``. One process (``store``
        None): once a signal came. Several: a rank with a signal raises ``key/flag`` in the
        job's key-value store; each rank that sees it notes its step, and once all ``world``
        have, every rank stops at its first safe point at or past the latest noted step +
        :data:`AHEAD`. Ranks are at most a step apart (each step's gradients are all-reduced)
        and read the store at every safe point once the flag is up, so when the last rank
        notes its step, the others are at most one step past it and learn the stop step at
        their next safe point, before they reach it."""
        if store is None:
            return self.received is not None
        if self._target is None:
            self._target = self._read_target(store, key, step, rank, world)
        return self._target is not None and step >= self._target

    def _read_target(self, store: Any, key: str, step: int, rank: int, world: int) -> int | None:
        if self.received is not None and not self._flag_seen:
            store.set(f"{key}/flag", "1")
            self._flag_seen = True
        if not self._flag_seen:
            self._looked_at = time.monotonic()
            self._flag_seen = store.check([f"{key}/flag"])
            if not self._flag_seen:
                return None
        if not self._noted:
            self._noted = True
            store.set(f"{key}/step/{rank}", str(step))
            store.add(f"{key}/noted", 1)
        if store.add(f"{key}/noted", 0) < world:
            return None
        return max(int(store.get(f"{key}/step/{r}")) for r in range(world)) + AHEAD

    def due(self, step: int, alone: bool) -> bool:
        """Whether the next safe point stops (at optimizer step ``step``): a signal came (one
        process), or the agreed step is known and reached (several)."""
        if alone:
            return self.received is not None
        return self._target is not None and step >= self._target

    def start_deadline(self, on_expiry: Callable[[], None]) -> None:
        """Call ``on_expiry`` (which must end the process) when the grace period, counted from
        the signal, runs out before the save is done."""
        since = self.received[1] if self.received is not None else time.monotonic()
        left = max(0.0, self.grace_s - (time.monotonic() - since))
        self._deadline = threading.Timer(left, on_expiry)
        self._deadline.daemon = True
        self._deadline.start()
