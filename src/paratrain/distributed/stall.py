"""A hang named in seconds: compare every rank's collectives when the ranks stop making progress.

    monitor = StallMonitor(store, rank=0, world_size=4, log=CollectiveLog(0).install())
    monitor.publish(step, main_stack)           # the watchdog, every 2 s: this rank's state
    cause = monitor.check(idle_s, waiting=True)  # past the threshold: every rank's state compared

Each rank's watchdog publishes, through the job's key-value store, the collective its main thread
is in (sequence number, op, shapes, process group, the script's line: :mod:`.collective_log`),
where its main thread is, and for how long that place has not changed. When a rank has made no
progress for the stall threshold (``stall_s``; by default max(30 s, 20 x the p99 step time)) while
it waits in a collective, it reads every rank's state and names the cause:

- **mismatched collectives**: rank 0 in all_reduce #57 at train.py:88, rank 1 in broadcast #57
  at train.py:93 (or at different sequence numbers: one was called on some ranks only);
- **shape mismatch**: the same collective with different shapes;
- **two process groups** waiting on each other;
- **a rank that never reached** the collective the others wait in, with where it is instead: in
  its own code (a loop), in the data loader, in I/O or a sleep, or not answering at all (its state
  stopped coming: native code holding the GIL, or a dead process). A rank whose main thread is
  still moving is busy, not stuck: nothing is declared for it (``timeout_s`` remains the limit).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from paratrain.distributed.collective_log import CollectiveLog

KEY = "paratrain/stall/{rank}"
MIN_STALL_S = 30.0
STEP_TIMES = 20.0
"""The default threshold is this many p99 step times (at least :data:`MIN_STALL_S`)."""
STUCK_S = 10.0
"""A rank whose main thread has not moved for this long (or the threshold, if shorter) is stuck."""
PUBLISH_EVERY_S = 2.0
SILENT_S = 10.0
"""A rank whose state is older than this has stopped publishing."""

SAME_SHAPES = frozenset(
    {
        "all_reduce",
        "broadcast",
        "all_gather",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "reduce",
    }
)
"""Collectives whose tensors have the same shapes on every rank (not gather, scatter or
all_to_all, whose per-rank arguments differ by design)."""

WHY = {
    "two process groups": "the ranks wait in different process groups, each for the others: "
    "call the groups' collectives in the same order on every rank",
    "mismatched collectives": "the ranks are in different collectives: one was called on some "
    "ranks only (under `if rank == 0`, an early exit, a different number of batches), or in "
    "another order",
    "shape mismatch": "the same collective with different shapes: every rank must pass tensors "
    "of the same shape and dtype",
    "collective does not complete": "every rank is in the same collective and none is behind: "
    "the transport does not complete it (network, NCCL; see the stacks)",
}


def _stack_places(stack: Sequence[Any]) -> list[tuple[str, int]]:
    return [(f.filename, f.lineno or 0) for f in stack]


BLOCKING = re.compile(
    r"\b(sleep|acquire|wait|join|get|put|read|readline|readinto|recv|recv_into|accept|connect|"
    r"select|poll|communicate|input)\("
)
"""Calls that block in C (no Python frame of their own): seen in the innermost line's text."""


def _kind_of_place(stack: Sequence[Any]) -> str:
    """Where a rank that is not in a collective is stuck, by its innermost frames."""
    files = [f.filename.replace("\\", "/") for f in stack[-6:]]
    if any("/torch/utils/data/" in f for f in files):
        return "in the data loader (a worker died or blocks)"
    inner = stack[-1] if stack else None
    blocking_module = files and files[-1].endswith(
        ("/socket.py", "/ssl.py", "/queue.py", "/threading.py", "/subprocess.py", "/selectors.py")
    )
    if blocking_module or (inner is not None and BLOCKING.search(inner.line or "")):
        return "blocked in I/O, a lock, a queue or a sleep"
    return "in its own code (a loop that does not end?)"


class StallMonitor:
    """See the module docstring."""

    def __init__(
        self,
        store: Any,
        *,
        rank: int,
        world_size: int,
        log: CollectiveLog,
        stall_s: float | None = None,
    ) -> None:
        self.store, self.rank, self.world_size, self.log = store, rank, world_size, log
        self.stall_s = stall_s
        self._intervals: deque[float] = deque(maxlen=200)
        self._step, self._step_at = -1, time.monotonic()
        self._places: list[tuple[str, int]] = []
        self._same_since = time.monotonic()
        self._published = 0.0

    def note_step(self, step: int) -> None:
        """Called with every progress: the time between step changes feeds the threshold."""
        if step != self._step:
            now = time.monotonic()
            if self._step >= 0:
                self._intervals.append(now - self._step_at)
            self._step, self._step_at = step, now

    def threshold(self) -> float:
        """Seconds of no progress after which the ranks are compared."""
        if self.stall_s is not None:
            return self.stall_s
        if not self._intervals:
            return MIN_STALL_S
        ordered = sorted(self._intervals)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return max(MIN_STALL_S, STEP_TIMES * p99)

    def due(self, idle_s: float) -> bool:
        """Whether the watchdog should read the main thread's stack now: to publish it (every
        :data:`PUBLISH_EVERY_S`) or to judge a stall."""
        return time.monotonic() - self._published >= PUBLISH_EVERY_S or idle_s >= self.threshold()

    def publish(self, step: int, stack: Sequence[Any], verdict: Any) -> None:
        """This rank's state in the store."""
        now = time.monotonic()
        places = _stack_places(stack)
        if places != self._places:
            self._places, self._same_since = places, now
        self._published = now
        state = {
            "rank": self.rank,
            "step": step,
            **self.log.state(),
            "where": verdict.short,
            "call": verdict.call,
            "waiting": bool(verdict.waiting),
            "place": _kind_of_place(stack),
            "same_s": round(now - self._same_since, 1),
            "time": time.time(),
        }
        # A store that went away: the hard timeout (timeout_s) still ends the job.
        with contextlib.suppress(Exception):
            self.store.set(KEY.format(rank=self.rank), json.dumps(state))

    def states(self) -> dict[int, dict[str, Any]]:
        """Every rank's last published state (ranks that published nothing are left out)."""
        found = {}
        for rank in range(self.world_size):
            key = KEY.format(rank=rank)
            try:
                if not self.store.check([key]):
                    continue
                found[rank] = json.loads(self.store.get(key))
            except Exception:
                continue
        return found

    def check(self, idle_s: float, *, waiting: bool) -> dict[str, Any] | None:
        """The named cause once this rank has waited past the threshold, else None."""
        if idle_s < self.threshold() or not (waiting or self.log.current is not None):
            return None
        states = self.states()
        now = time.time()
        for state in states.values():  # a rank that stopped publishing is stuck where no
            silent = now - state.get("time", now)  # Python runs (native code holding the GIL)
            if silent > SILENT_S:
                state.update(
                    inside=False,
                    waiting=False,
                    same_s=silent,
                    place="not answering (blocked in native code holding the GIL, or gone)",
                )
        return name_cause(states, stuck_s=min(STUCK_S, self.threshold() / 2))


def _at(state: dict[str, Any]) -> str:
    entry = state.get("collective")
    if not state.get("inside") or entry is None:
        call = f" (in {state['call']})" if state.get("call") else ""
        return f"at {state['where']}{call}"
    shapes = f" of {entry['shapes']}" if entry.get("shapes") else ""
    return f"in {entry['op']} #{entry['seq']}{shapes} at {entry['where']}"


def _shapes_differ(states: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The same collective (number and op) called with different shapes, whether the ranks are
    still in it or some passed it (gloo can complete a ring with the wrong sizes on some ranks)."""
    calls: dict[tuple[int, str], dict[int, str]] = {}
    for rank, state in states.items():
        entry = state.get("collective")
        if entry is not None and entry["op"] in SAME_SHAPES:
            calls.setdefault((entry["seq"], entry["op"]), {})[rank] = entry["shapes"]
    for (seq, op), shapes in sorted(calls.items(), reverse=True):
        if len(set(shapes.values())) > 1:
            by_shape: dict[str, list[int]] = {}
            for rank, shape in sorted(shapes.items()):
                by_shape.setdefault(shape, []).append(rank)
            described = "; ".join(
                f"rank(s) {', '.join(map(str, ranks))}: {shape}"
                for shape, ranks in by_shape.items()
            )
            odd = min(by_shape.values(), key=len)
            where = next(iter(states.values()))
            line = next(
                (st["collective"]["where"] for st in states.values() if st.get("collective")),
                where.get("where", "?"),
            )
            return {
                "kind": "shape mismatch",
                "ranks": odd,
                "summary": f"{WHY['shape mismatch']}: {op} #{seq} at {line}: {described}",
            }
    return None


def name_cause(
    states: dict[int, dict[str, Any]], *, stuck_s: float = STUCK_S
) -> dict[str, Any] | None:
    """The cause of a stall from every rank's state (see the module docstring), or None while
    a rank that is not waiting is still moving (busy, not stuck)."""
    if not states:
        return None
    waiting = {r: s for r, s in states.items() if s.get("inside") or s.get("waiting")}
    others = {r: s for r, s in states.items() if r not in waiting}
    mismatched = _shapes_differ(states)
    if mismatched is not None and waiting:
        return mismatched
    if others:
        stuck = {r: s for r, s in others.items() if s.get("same_s", 0) >= stuck_s}
        if not stuck or not waiting:
            return None
        first = min(waiting)
        target = _at(waiting[first])
        culprits = "; ".join(
            f"rank {r} is {s['place']} at {s['where']}, for {s['same_s']:.0f} s"
            for r, s in sorted(stuck.items())
        )
        names = ", ".join(str(r) for r in sorted(waiting))
        return {
            "kind": "never reached",
            "ranks": sorted(stuck),
            "summary": (
                f"rank(s) {', '.join(map(str, sorted(stuck)))} never reached the collective that "
                f"rank(s) {names} wait in (rank {first} {target}): {culprits}"
            ),
        }
    entries = {r: s.get("collective") if s.get("inside") else None for r, s in states.items()}
    recorded = {r: e for r, e in entries.items() if e is not None}
    described = ", ".join(f"rank {r} {_at(s)}" for r, s in sorted(states.items()))
    if len(recorded) == len(states):
        seqs = {e["seq"] for e in recorded.values()}
        ops = {e["op"] for e in recorded.values()}
        groups = {e.get("group_name") for e in recorded.values()}
        shapes = {e["shapes"] for e in recorded.values()}
        if len(groups) > 1:
            kind = "two process groups"
        elif len(seqs) > 1 or len(ops) > 1:
            kind = "mismatched collectives"
        elif len(shapes) > 1 and ops <= SAME_SHAPES:
            kind = "shape mismatch"
        else:
            kind = "collective does not complete"
        why = WHY[kind]
        behind = min(recorded, key=lambda r: recorded[r]["seq"])
        return {"kind": kind, "ranks": [behind], "summary": f"{why}: {described}"}
    # Some ranks wait where no collective was recorded (DDP's gradient all-reduce in backward,
    # a wait on an asynchronous one): different places mean different collectives.
    places = {(_at(s) if r not in recorded else f"{recorded[r]['op']}") for r, s in states.items()}
    low = min(s.get("step", 0) for s in states.values())
    lowest = sorted(r for r, s in states.items() if s.get("step", 0) == low)
    if len(places) > 1:
        return {
            "kind": "mismatched collectives",
            "ranks": lowest,
            "summary": f"{WHY['mismatched collectives']}: {described}",
        }
    return {
        "kind": "collective does not complete",
        "ranks": lowest,
        "summary": f"{WHY['collective does not complete']}: {described}",
    }
