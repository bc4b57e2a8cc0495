"""Run torchrun as a child: echo its stderr, keep the tail, pass Ctrl-C and SIGTERM on to it.

    code, stopped_by, tail = supervise(plan.argv, env)
    if stopped_by is not None:          # SIGINT or SIGTERM reached paratrain run
        return STOPPED[stopped_by][1]   # 130 or 143: torchrun has stopped the ranks

A Ctrl-C in a terminal reaches every process of the foreground group at once, torchrun included;
a second SIGINT would interrupt torchrun's own shutdown of the ranks. So a signal is forwarded
only when torchrun has not reacted to it within :data:`FORWARD_AFTER_S` (it was sent to
``paratrain run`` alone, e.g. ``kill -INT``): torchrun logs "death signal" when it gets one.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import subprocess
import sys
import threading

from paratrain.commands.run.rank_output import RankTracebacks

STOPPED = {signal.SIGINT: ("interrupted", 130), signal.SIGTERM: ("terminated", 143)}
"""What ``paratrain run`` says and returns when a signal stopped it (128 + the signal)."""
TO_RANKS = (signal.SIGUSR1, signal.SIGUSR2)
"""Signals passed straight to the ranks (torchrun's children): preemption notices, which
torchrun itself does not handle (it would die of them and leave the ranks behind)."""
FORWARD_AFTER_S = 1.0
TORCHRUN_GOT_IT = "death signal"
"""In torchrun's log line "Received SIGINT death signal, shutting down workers"."""


class _Forwarder:
    """The signal handler: note the signal, forward it unless torchrun reacts on its own."""

    def __init__(self) -> None:
        self.received: list[signal.Signals] = []
        self.child: subprocess.Popen[str] | None = None
        self.child_reacted = threading.Event()
        self.pending: list[signal.Signals] = []
        """Signals due to be forwarded before torchrun was started."""

    def handle(self, signum: int, frame: object) -> None:
        sig = signal.Signals(signum)
        self.received.append(sig)
        timer = threading.Timer(FORWARD_AFTER_S, self.forward, (sig,))
        timer.daemon = True
        timer.start()

    def forward(self, sig: signal.Signals) -> None:
        child = self.child
        if child is None:
            self.pending.append(sig)
            return
        if child.poll() is not None or self.child_reacted.is_set():
            return
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(sig)  # torchrun stops its ranks with this signal, then exits

    def to_ranks(self, signum: int, frame: object) -> None:
        """Pass ``signum`` to every rank of this node (torchrun's direct children)."""
        import psutil

        child = self.child
        if child is None or child.poll() is not None:
            return
        with contextlib.suppress(psutil.Error):
            for rank in psutil.Process(child.pid).children():
                with contextlib.suppress(psutil.Error):
                    rank.send_signal(signum)

    def watch(self, line: str) -> None:
        if TORCHRUN_GOT_IT in line:
            self.child_reacted.set()


def supervise(
    argv: list[str], env: dict[str, str], *, tracebacks: RankTracebacks | None = None
) -> tuple[int, signal.Signals | None, str]:
    """Run ``argv``; return its exit code, the signal that stopped us (or None), its stderr tail.

    The tail is the last 200 lines, where torchrun's failure report is. With ``tracebacks``, the
    ranks' tracebacks are shown through it (the failing rank's first) and collected there.
    """
    shown_by = tracebacks or _Unchanged()
    forwarder = _Forwarder()
    on_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, forwarder.handle) for sig in STOPPED} if on_main else {}
    if on_main:
        previous.update({sig: signal.signal(sig, forwarder.to_ranks) for sig in TO_RANKS})
    try:
        proc = subprocess.Popen(
            argv, env=env, stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1
        )
        forwarder.child = proc
        for sig in forwarder.pending:
            forwarder.forward(sig)
        captured: collections.deque[str] = collections.deque(maxlen=200)
        noise = AgentNoise()
        assert proc.stderr is not None
        for line in proc.stderr:
            for kept in noise.feed(line):
                for shown in shown_by.feed(kept):
                    sys.stderr.write(shown)
            captured.append(line)
            forwarder.watch(line)
        for kept in noise.flush():
            for shown in shown_by.feed(kept):
                sys.stderr.write(shown)
        code = proc.wait()
        for shown in shown_by.flush(failed=code != 0):
            sys.stderr.write(shown)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    stopped_by = forwarder.received[0] if forwarder.received else None
    return code, stopped_by, "".join(captured)


class _Unchanged:
    """The filter that shows every line as it is."""

    def feed(self, line: str) -> list[str]:
        return [line]

    def flush(self, *, failed: bool = True) -> list[str]:
        return []


class AgentNoise:
    """Drops torchrun's own traceback of ``ChildFailedError`` and its failure table: paratrain
    names the failed rank in one line, and the ranks' own output (``[rankN]:``) stays. So is its
    ``SignalException`` (torchrun stopping on a signal paratrain run reports). Any other
    traceback of torchrun (a rendezvous error, say) is shown whole."""

    def __init__(self) -> None:
        self._held: list[str] = []
        self._in_report = False
        self._seen_root = False

    def feed(self, line: str) -> list[str]:
        """The lines to show now, given the next line of torchrun's stderr."""
        if self._in_report:
            self._seen_root = self._seen_root or line.startswith("Root Cause")
            if self._seen_root and line.startswith("====="):
                self._in_report = self._seen_root = False
            return []
        if self._held:
            self._held.append(line)
            if line[:1].isspace() or line.startswith("Traceback"):
                return []
            held, self._held = self._held, []
            if "ChildFailedError" in line or "SignalException" in line:
                self._in_report = True
                return []
            return held
        if line.startswith("Traceback (most recent call last):"):
            self._held = [line]
            return []
        return [line]

    def flush(self) -> list[str]:
        """Whatever is still held when the output ends."""
        held, self._held = self._held, []
        return held
