"""``paratrain.launch``: a function on N local ranks, its result, and a failing rank named."""

from __future__ import annotations

import pytest
import torch

import paratrain as pt
from paratrain.launcher.spawn import RankFailedError

pytestmark = pytest.mark.dist


def _train_and_report(scale: float) -> dict[str, object]:
    with pt.Run(strategy="ddp", progress=False, stats_every=None) as run:
        value = run.reduce(torch.tensor([float(run.rank + 1)]), "sum") * scale
        return {
            "rank": run.rank,
            "world": run.world_size,
            "source": run.topology.source,
            "sum": float(value),
        }


def _fail_on_rank_one() -> None:
    with pt.Run(strategy="ddp", progress=False, stats_every=None) as run:
        if run.rank == 1:
            raise ValueError("bad batch on rank 1")
        run.barrier()


def test_launch_returns_rank_zero_result() -> None:
    result = pt.launch(_train_and_report, nproc=2, args=(10.0,))
    assert result == {"rank": 0, "world": 2, "source": "torchrun", "sum": 30.0}


def test_a_failing_rank_is_named() -> None:
    with pytest.raises(RankFailedError, match="rank 1 failed") as err:
        pt.launch(_fail_on_rank_one, nproc=2, timeout_s=120)
    assert "bad batch on rank 1" in str(err.value) and err.value.rank == 1
