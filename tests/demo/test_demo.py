"""``paratrain demo`` end to end: torchrun, 2 gloo ranks, save, reload in a fresh process."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paratrain.demo.digits import DigitsCNN
from paratrain.monitor.snapshot import snapshot
from tests.support.images import png_size

pytestmark = pytest.mark.dist


def test_demo_trains_saves_reloads_and_plots(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paratrain",
            "demo",
            "--nproc",
            "2",
            "--no-progress",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((run_dir / "train_result.json").read_text())
    assert result["world_size"] == 2 and result["strategy"] == "ddp"
    assert result["test_accuracy"] >= 0.95
    assert result["test_samples"] == 359  # every held-out sample exactly once over 2 ranks
    assert "reloaded in a fresh CPU process" in proc.stdout and "OK" in proc.stdout
    # The saved weights are plain, unprefixed CPU tensors that load without any strategy.
    state = torch.load(run_dir / "model.pt", weights_only=True, map_location="cpu")
    assert state.keys() == DigitsCNN().state_dict().keys()
    # Only the main process prints the epoch lines.
    assert proc.stdout.count("epoch 12/12") == 1
    width, height = png_size(run_dir / "curves.png")
    assert width > 500 and height > 200
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 12
    # The runtime's per-rank stats, as `paratrain monitor` reads them.
    snap = snapshot(run_dir)
    assert [r["rank"] for r in snap["ranks"]] == [0, 1]
    assert snap["ranks"][0]["step"] == snap["ranks"][1]["step"] == 270  # every 10 of 276 steps
