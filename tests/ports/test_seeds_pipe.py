"""The seeds' Pipe example as a paratrain pipeline on 2 ranks: a rank SIGKILLed mid-epoch under
`paratrain run --max-restarts 1` ends bit-identical to an uninterrupted pipeline run, and both
end at the weights of the same script in one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.dist
SCRIPT = Path(__file__).with_name("seeds_pipe.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def launch(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "paratrain", "run", "--nproc", "2", "--max-restarts", "1"]
    cmd += ["--run-dir", str(run_dir), str(SCRIPT), "--out", str(run_dir / "final.pt"), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)


@pytest.mark.e2e
def test_pipe_port_restarts_bit_identical_and_matches_one_process(tmp_path: Path) -> None:
    straight = launch(tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "epoch 2: loss" in straight.stdout
    killed = launch(tmp_path / "killed", "--kill-rank", "1", "--kill-step", "40")
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert (tmp_path / "killed" / "restarts.jsonl").read_text().count('"resumed": true') == 1
    alone = subprocess.run(
        [sys.executable, str(SCRIPT), "--strategy", "cpu", "--out", str(tmp_path / "alone.pt")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-3000:]
    want = torch.load(tmp_path / "straight" / "final.pt", weights_only=True)
    got = torch.load(tmp_path / "killed" / "final.pt", weights_only=True)
    one = torch.load(tmp_path / "alone.pt", weights_only=True)
    assert want.keys() == got.keys() == one.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert max(float((want[k] - one[k]).abs().max()) for k in want) <= 1e-4
