"""The shipped example trains under ``paratrain run --nproc 2`` (the launchers' files that run it
are tested in ``tests/examples/test_launchers.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train.py"


@pytest.mark.examples
def test_the_example_trains_one_epoch_on_two_ranks(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "paratrain", "run", "--nproc", "2", "--backend", "gloo",
         "--run-dir", str(run_dir), str(EXAMPLE), "--epochs", "1", "--samples", "512",
         "--grad-accum", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("epoch 0: loss") == 1  # the main process prints, once
    steps = 512 // (64 * 2 * 2)
    assert f"step {steps}" in proc.stdout
    assert len(list((run_dir / "checkpoints").iterdir())) == 1
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["loss"] > 0
    weights = torch.load(run_dir / "model.pt", weights_only=True)
    assert {k: tuple(v.shape) for k, v in weights.items()} == {
        "0.weight": (128, 16), "0.bias": (128,), "2.weight": (4, 128), "2.bias": (4,)
    }  # fmt: skip
