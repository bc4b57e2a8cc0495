"""Kill points chosen from the trace of an uninterrupted run.

    events = read_trace(Path("runs/verify-resume/straight-1/verify-resume/trace"))
    for choice in choose(events, kills=4, world_size=2, seed=0):
        choice.point          # KillPoint("mid_window", 6, 1): rank 1 dies at its 6th one
        choice.step, choice.epoch

Kinds are taken in the order of :data:`KINDS` (the events, and ``preempt``: a SIGTERM sent at
a step), skipping those the run never reached; with more kills than kinds, the same kinds come
round again with other ordinals. Each kind's ordinals are spread through the run: the middle
occurrence first, then a quarter and three quarters of the way, and so on (never the first while
others are left). The kills alternate between the last rank and rank 0, starting with the last
(another rank that has the event when the preferred one never has it: only the main process
writes a replicated checkpoint). A ``seed`` other than 0 draws the ordinals in a random order
instead.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from paratrain.core.faults import EVENTS, PREEMPT, KillPoint

KINDS = ("mid_window", "step", "saved", "save_write", PREEMPT, "eval_batch", "epoch")
"""Kill point kinds in the order verify-resume takes them: the events, and a preemption signal
(SIGTERM) sent at a step, found at the ``step`` events of the trace."""

SOURCE = {PREEMPT: "step"}
"""The event a kind is found at, where it is not an event itself."""

DESCRIPTIONS = {
    "mid_window": "mid accumulation window",
    "step": "just after an optimizer step",
    "saved": "right after a save returned",
    "save_write": "during a save's write",
    PREEMPT: "SIGTERM (preemption) after a step",
    "eval_batch": "mid eval pass",
    "epoch": "at an epoch boundary",
}
"""What each event kind means as a kill point, in the table's words."""


@dataclass(frozen=True, slots=True)
class Event:
    """One line of a trace."""

    event: str
    n: int
    step: int
    epoch: int
    rank: int
    restart: int


@dataclass(frozen=True, slots=True)
class Choice:
    """A kill point and where the uninterrupted run was when it reached it."""

    point: KillPoint
    step: int
    epoch: int

    def describe(self) -> str:
        """``"just after an optimizer step (step #7)"``."""
        return f"{DESCRIPTIONS[self.point.event]} ({self.point.event} #{self.point.n})"


_FIELDS = ("event", "n", "step", "epoch", "rank", "restart")


def read_trace(folder: Path) -> list[Event]:
    """Every rank's events (``rank<r>.jsonl``), skipping lines that do not parse (a rank
    stopped mid-line by torchrun)."""
    events = []
    for path in sorted(folder.glob("rank*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                raw = json.loads(line)
                event = Event(**{k: raw[k] for k in _FIELDS})
            except (ValueError, TypeError, KeyError):
                continue
            if event.event in EVENTS:
                events.append(event)
    return events


def spread(count: int) -> list[int]:
    """Indices ``0..count-1`` in the order they are tried: the middle first, then the quarter
    points, the eighths, ..., and the first index last."""
    order: list[int] = []
    parts = 2
    while len(order) < count:
        for k in range(1, parts, 2):
            index = min(count - 1, k * count // parts)
            if index not in order:
                order.append(index)
        parts *= 2
        if parts > 4 * count:
            order += [i for i in range(count) if i not in order]
    if count > 1 and order[-1] != 0:
        order.remove(0)
        order.append(0)
    return order


def choose(events: list[Event], *, kills: int, world_size: int, seed: int = 0) -> list[Choice]:
    """Up to ``kills`` distinct kill points from the first attempt's ``events``."""
    first = [e for e in events if e.restart == 0]
    by_kind: dict[str, dict[int, list[Event]]] = {}
    for e in sorted(first, key=lambda e: (e.event, e.rank, e.n)):
        by_kind.setdefault(e.event, {}).setdefault(e.rank, []).append(e)
    for kind, source in SOURCE.items():
        if source in by_kind:
            by_kind[kind] = by_kind[source]
    queues = {
        (kind, rank): _order(found, seed, later=kind in SOURCE)
        for kind, ranks in by_kind.items()
        for rank, found in ranks.items()
    }
    kinds = [k for k in KINDS if k in by_kind]
    chosen: list[Choice] = []
    while len(chosen) < kills and any(queues.values()):
        for kind in kinds:
            if len(chosen) == kills:
                break
            last = chosen[-1].point.rank if chosen else 0
            preferred = 0 if last == world_size - 1 and chosen else world_size - 1
            ranks = sorted(by_kind[kind], key=lambda r: (r != preferred, r))
            rank = next((r for r in ranks if queues[(kind, r)]), None)
            if rank is None:
                continue
            e = queues[(kind, rank)].pop(0)
            chosen.append(Choice(KillPoint(kind, e.n, rank), e.step, e.epoch))
    return chosen


def _order(found: list[Event], seed: int, *, later: bool = False) -> list[Event]:
    """``found`` in the order tried; ``later``: a kind found at another kind's events takes
    them from the back of that order (another step than the plain ``step`` kill)."""
    if seed:
        shuffled = list(found)
        random.Random(f"{seed}:{found[0].event}:{found[0].rank}:{later}").shuffle(shuffled)
        return shuffled
    order = [found[i] for i in spread(len(found))]
    return order[1:] + order[:1] if later and len(order) > 1 else order
