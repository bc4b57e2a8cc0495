"""FSDP on 2 real gloo ranks saving to and resuming from S3 (moto on loopback): each rank uploads
the shards it wrote, rank 0 the rest and the manifest last; the resumed run continues exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import paratrain as pt
from tests.support.distributed import run_distributed
from tests.support.s3 import Bucket
from tests.support.training import dataset, mlp

pytestmark = pytest.mark.dist


def _steps(run: pt.Run, model: nn.Module, opt: torch.optim.Optimizer, n: int) -> None:
    x, y = dataset(16)[:]
    share = slice(run.rank * 8, run.rank * 8 + 8)  # each rank its half of the batch
    for _ in range(n):
        with run.accumulate(model):
            run.backward(nn.functional.cross_entropy(model(x[share]), y[share]))
        run.step(opt)


def _model(run: pt.Run) -> tuple[nn.Module, torch.optim.Optimizer]:
    net = mlp()
    model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
    return model, opt


def _save_then_resume(url: str, root: str) -> dict[str, Any]:
    """Saves at step 3 (async) and 5 (sync), each resumed on a "new machine" (run dir) and
    trained 2 steps further, next to the uninterrupted run."""
    settings: dict[str, Any] = {"strategy": "fsdp", "progress": False, "ckpt_dir": url, "seed": 0}
    out: dict[str, Any] = {}
    with pt.Run(run_dir=Path(root) / "a", async_save=True, **settings) as run:
        model, opt = _model(run)
        _steps(run, model, opt, 3)
        run.save()  # uploads in the background while training goes on
        for step in (5, 7):
            _steps(run, model, opt, 2)
            out[f"straight{step}"] = run.strategy.full_state_dict(model)
    for start, name in ((3, "b"), (5, "c")):
        with pt.Run(run_dir=Path(root) / name, **settings) as run:
            model, opt = _model(run)
            run.resume()
            out[f"resumed_at{start}"] = run.global_step
            _steps(run, model, opt, 2)
            out[f"resumed{start + 2}"] = run.strategy.full_state_dict(model)
            if start == 3:
                run.save()
    return out


def test_fsdp_saves_to_s3_and_resumes_exactly(s3: Bucket, tmp_path: Path) -> None:
    url = s3.url("fsdp")
    for out in run_distributed(_save_then_resume, 2, url, str(tmp_path)):
        assert out["resumed_at3"] == 3 and out["resumed_at5"] == 5
        for step in (5, 7):
            straight, resumed = out[f"straight{step}"], out[f"resumed{step}"]
            assert all(torch.equal(resumed[k], v) for k, v in straight.items())
    for step in (3, 5):
        prefix = f"fsdp/step-{step:08d}/"
        assert [key[len(prefix) :] for key in s3.keys(prefix)] == [
            "dcp/.metadata",
            "dcp/__0_0.distcp",
            "dcp/__1_0.distcp",
            "manifest.json",
            "manifest.xxh3",
            "trainer.pt",
        ]
