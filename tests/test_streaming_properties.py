"""Property (make scale-test): a stream of any length, stopped at any step of its first epoch on
any layout and resumed on another one (world size, DataLoader workers per rank, or both), sees
every example once in the rest of the resumed epoch and exactly once in every later epoch.

Real gloo ranks (spawned) and real forked DataLoader workers; the stop is a save followed by the
end of the processes, what a kill right after the save leaves. The one loss the README documents
for any stream: when the ranks' shares end at different batches, every rank ends the pass at the
first end. The rest of a resumed epoch is split anew, with shares that differ by at most one
example, so at most one example per new worker falls past that end (fewer than ranks x workers);
the later epochs use lengths whose shares are equal, so nothing is lost there.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import Phase, assume, example, given, settings
from hypothesis import strategies as st

from tests.support.distributed import run_distributed
from tests.support.streams import train_on_stream

pytestmark = [pytest.mark.scale, pytest.mark.dist]
EPOCHS = 3


@dataclass(frozen=True)
class Case:
    n: int
    before: tuple[int, int]
    """(ranks, DataLoader workers per rank) of the run that is stopped."""
    after: tuple[int, int]
    """(ranks, workers) of the resumed run."""
    batch: int
    stop_at: int


@contextlib.contextmanager
def stacks_on_failure(root: str) -> Iterator[None]:
    """Print what the hang watchdog wrote (every thread's stack) when a rank fails, before the
    temporary folder goes: a stall then shows where each thread waited."""
    try:
        yield
    except Exception:
        for path in sorted(Path(root, "stacks").glob("rank*.txt")):
            print(f"--- {path.name}\n{path.read_text()}", file=sys.stderr)
        raise


def _steps(n: int, ranks: int, workers: int, batch: int) -> int:
    """Steps of an epoch: every rank stops at the first rank's last batch."""
    every = ranks * max(workers, 1)
    shares = [len(range(k, n, every)) for k in range(every)]
    per_rank = [shares[r * max(workers, 1) : (r + 1) * max(workers, 1)] for r in range(ranks)]
    return min(sum(-(-s // batch) for s in rank) for rank in per_rank)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    before = (draw(st.integers(1, 3)), draw(st.integers(0, 2)))
    after = draw(st.tuples(st.integers(1, 3), st.integers(0, 3)).filter(lambda a: a != before))
    batch = draw(st.integers(1, 3))
    n = after[0] * max(after[1], 1) * batch * draw(st.integers(1, 4))  # equal shares after
    steps = _steps(n, *before, batch)
    assume(steps >= 2)
    return Case(n, before, after, batch, draw(st.integers(1, steps - 1)))


@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.generate])
@example(Case(n=40, before=(2, 2), after=(1, 2), batch=4, stop_at=3))  # the 2 -> 1 resume
@example(Case(n=36, before=(1, 2), after=(2, 3), batch=2, stop_at=4))  # more of both
@given(case=cases())
def test_a_stream_resumed_on_another_layout_sees_each_example_once(case: Case) -> None:
    source = ("Counting", case.n)
    with tempfile.TemporaryDirectory(prefix="paratrain-stream-") as root:
        stopped = functools.partial(
            train_on_stream, stop_at=case.stop_at, epochs=EPOCHS, batch_size=case.batch,
            workers=case.before[1],
        )  # fmt: skip
        resumed = functools.partial(
            train_on_stream, epochs=EPOCHS, batch_size=case.batch, workers=case.after[1]
        )
        with stacks_on_failure(root):
            first = run_distributed(stopped, case.before[0], source, root)
            rest = run_distributed(resumed, case.after[0], source, root)
    seen: dict[int, list[int]] = {e: [] for e in range(EPOCHS)}
    for run in (*first, *rest):
        for epoch, ids in zip(run["epochs"], run["seen"], strict=True):
            seen[epoch] += ids
    resumed_epoch = seen[0]
    assert len(resumed_epoch) == len(set(resumed_epoch)), case  # nothing twice
    shares = case.after[0] * max(case.after[1], 1)
    assert case.n - len(resumed_epoch) < shares, case  # at most the documented common end
    for epoch in range(1, EPOCHS):
        assert sorted(seen[epoch]) == list(range(case.n)), (case, epoch)
