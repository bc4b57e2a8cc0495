"""The ranks' agreement on the step to stop at, with a shared in-memory store and a fake clock:
every rank stops at the same step and learns it before it gets there, whenever each rank looks
at the store."""

from __future__ import annotations

import signal

import pytest
from torch.distributed import HashStore

from paratrain.runtime import preemption as module
from paratrain.runtime.preemption import CHECK_EVERY_S, Preemption


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _safe_point(p: Preemption, store: HashStore, step: int, rank: int, world: int) -> bool:
    if p.quiet(alone=False):
        return False
    return p.agreed(store, "k", step, rank=rank, world=world)


@pytest.mark.parametrize("signalled", [0, 1, 2])
@pytest.mark.parametrize("step_s", [0.0002, 0.003, 0.5])
@pytest.mark.parametrize("signal_step", [0, 1, 7, 40])
def test_every_rank_stops_at_the_same_step(
    monkeypatch: pytest.MonkeyPatch, signalled: int, step_s: float, signal_step: int
) -> None:
    clock = Clock()
    monkeypatch.setattr(module.time, "monotonic", clock)
    world = 3
    store = HashStore()
    ranks = [Preemption(("SIGTERM",), grace_s=25, warn=print) for _ in range(world)]
    # Rank 2 starts later and its looks fall at other times than the others'.
    clock.now += 0.004
    stopped: dict[int, int] = {}
    for step in range(2000):
        for rank, p in enumerate(ranks):
            if rank in stopped:
                continue
            if rank == signalled and step == signal_step:
                p.received = (signal.SIGTERM, clock.now)
            for _ in range(1 + rank % 2):  # unequal numbers of safe points per step
                if _safe_point(p, store, step, rank, world):
                    stopped[rank] = step
                    break
            clock.now += step_s / world
        if len(stopped) == world:
            break
        assert not stopped or len(stopped) == world, f"rank(s) {sorted(stopped)} stopped alone"
    assert len(stopped) == world and len(set(stopped.values())) == 1, stopped
    assert stopped[0] <= signal_step + 3 + (2 * CHECK_EVERY_S) / step_s + 3


def test_one_process_stops_at_the_next_safe_point() -> None:
    p = Preemption(("SIGTERM",), grace_s=25, warn=print)
    assert p.quiet(alone=True) and not p.agreed(None, "k", 0)
    p.received = (signal.SIGTERM, 0.0)
    assert not p.quiet(alone=True) and p.agreed(None, "k", 1)
