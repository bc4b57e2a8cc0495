"""Each rank's final state (PARATRAIN_FINAL_STATE): at close, and at exit for a run never closed;
the events a real loop emits (PARATRAIN_TRACE)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import paratrain as pt
from paratrain.runtime.final_state import local
from tests.support.training import dataset, mlp


class Counter:
    def __init__(self) -> None:
        self.count = 3

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "array": np.arange(3)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]


def test_close_writes_every_registered_piece_and_the_trace_has_every_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARATRAIN_FINAL_STATE", str(tmp_path / "final"))
    monkeypatch.setenv("PARATRAIN_TRACE", str(tmp_path / "trace"))
    with pt.Run(strategy="cpu", grad_accum=2, run_dir=tmp_path / "run", progress=False) as run:
        model = mlp()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        model, optimizer = run.setup(model, optimizer, scheduler=scheduler)
        run.track(Counter(), name="counter")
        loader = run.loader(dataset(16), batch_size=4)
        evaluation = run.eval_loader(dataset(8), batch_size=4)
        for _ in run.epochs(2):
            for x, y in loader:
                with run.accumulate(model):
                    run.backward(nn.functional.cross_entropy(model(x), y))
                run.step(optimizer, scheduler)
            for x, _ in evaluation:
                model(x)
            run.save(extras={"best": 0.5})
        weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.load(tmp_path / "final" / "rank0.pt", weights_only=True)
    assert list(state) == [
        "models", "optimizers", "schedulers", "objects", "loaders", "scaler", "loop", "rng",
        "extras", "meta",
    ]  # fmt: skip
    assert all(torch.equal(state["models"]["model"][k], v) for k, v in weights.items())
    assert state["optimizers"]["model"][0]["state"][0]["step"] == 4
    assert state["schedulers"]["scheduler"]["last_epoch"] == 4
    counter = state["objects"]["counter"]
    assert counter["count"] == 3 and torch.equal(counter["array"], torch.arange(3))
    assert "paratrain-trackers" not in state["objects"]
    assert state["loop"] == {
        "epoch": 2,
        "global_step": 4,
        "grad_accum": 2,
        "epoch_start_step": 4,
        "last_epoch_steps": 2,
        "mid_epoch_saves": False,
        "round_open": ["model:0"],
        "round_members": ["model:0"],
    }
    assert set(state["rng"]) >= {"python", "numpy", "torch"}
    assert state["extras"] == {"best": 0.5}
    assert state["meta"] == {"rank": 0, "restart": 0, "world_size": 1}
    lines = (tmp_path / "trace" / "rank0.jsonl").read_text().splitlines()
    events = collections.Counter(json.loads(line)["event"] for line in lines)
    assert events == {
        "mid_window": 4, "step": 4, "saved": 2, "save_write": 2, "eval_batch": 4, "epoch": 2,
    }  # fmt: skip


NEVER_CLOSED = """
import sys, torch, paratrain as pt
run = pt.Run(strategy="cpu", run_dir=sys.argv[1], progress=False)
model = run.setup(torch.nn.Linear(2, 2))
with torch.no_grad():
    model.weight.fill_(0.25)
"""


def test_a_run_never_closed_writes_its_state_at_exit(tmp_path: Path) -> None:
    env = {"PARATRAIN_FINAL_STATE": str(tmp_path / "final")}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NEVER_CLOSED), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, **env},
    )
    assert proc.returncode == 0, proc.stderr
    state = torch.load(tmp_path / "final" / "rank0.pt", weights_only=True)
    assert torch.equal(state["models"]["model"]["weight"], torch.full((2, 2), 0.25))
    assert state["extras"] == {}


def test_local_keeps_what_loads_safely_and_names_the_rest() -> None:
    value = {
        1: (np.float32(0.5), np.array(["a"]), torch.ones(2, requires_grad=True)),
        ("tuple", "key"): {"x": torch.float16, "y": object()},
    }
    plain = local(value)
    assert plain[1][0] == 0.5 and plain[1][1] == ["a"]
    assert not plain[1][2].requires_grad
    assert plain["('tuple', 'key')"] == {"x": "<torch.dtype>", "y": "<builtins.object>"}
