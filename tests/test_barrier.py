"""Named barriers on real gloo ranks: pass together, or name the rank that is elsewhere."""

from __future__ import annotations

import time

import pytest

import paratrain as pt
from paratrain.errors import ConfigError, ParatrainError
from tests.support.distributed import run_distributed

pytestmark = pytest.mark.dist


def _scenarios() -> dict[str, str]:
    # No `with` and no watchdog: rank 1 deliberately skips a barrier, so closing would wait on
    # it and the watchdog would (rightly) end the idle rank before it reports.
    run = pt.Run(strategy="ddp", progress=False, timeout_s=3, stats_every=None, watchdog=False)
    out = {}
    run.barrier("start")
    out["same"] = "passed"
    try:
        run.barrier("save" if run.rank == 0 else "eval")
        out["different"] = "passed"
    except ConfigError as err:
        out["different"] = str(err)
    if run.rank == 1:
        time.sleep(4)  # never joins the next barrier
        return out
    try:
        run.barrier("late")
        out["late"] = "passed"
    except ParatrainError as err:
        out["late"] = str(err)
    return out


def test_named_barriers() -> None:
    ranks = run_distributed(_scenarios, 2, exit_hard=True)
    assert ranks[0]["same"] == ranks[1]["same"] == "passed"
    for rank in ranks:
        assert "rank 0: 'save', rank 1: 'eval'" in rank["different"]
    assert "barrier 'late'" in ranks[0]["late"] and "1" in ranks[0]["late"]
