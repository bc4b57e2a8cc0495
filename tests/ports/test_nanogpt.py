"""The nanoGPT-shaped port: a rank SIGKILLed mid-loop under `paratrain run --max-restarts 1`
ends bit-identical to an uninterrupted run, and the restart is recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.dist
SCRIPT = Path(__file__).with_name("nanogpt_shaped.py")


def launch(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "paratrain.commands.cli",
        "run",
        "--nproc",
        "2",
        "--max-restarts",
        "1",
    ]
    cmd += ["--run-dir", str(run_dir), str(SCRIPT), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_sigkill_mid_loop_resumes_bit_identical(tmp_path: Path) -> None:
    straight = launch(tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = launch(tmp_path / "killed", "--kill-rank", "1", "--kill-step", "6")
    assert killed.returncode == 0, killed.stderr[-3000:]
    expected = torch.load(tmp_path / "straight" / "final.pt", weights_only=True)
    got = torch.load(tmp_path / "killed" / "final.pt", weights_only=True)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    lines = (tmp_path / "killed" / "restarts.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["restart"], r["resumed"], r["step"]) for r in records] == [(1, True, 4)]
    assert not (tmp_path / "straight" / "restarts.jsonl").exists()
