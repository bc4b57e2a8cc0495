"""A stalled rank ends the job within timeout + 30 s, named, with every rank's stacks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist
SCRIPT = Path(__file__).with_name("stall_train.py")


def test_stalled_rank_is_named_and_nobody_hangs(tmp_path: Path) -> None:
    run_dir = tmp_path / "job"
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paratrain",
            "run",
            "--nproc",
            "2",
            "--backend",
            "gloo",
            "--run-dir",
            str(run_dir),
            str(SCRIPT),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 124  # the watchdog's code for a stalled rank
    assert elapsed < 8 + 30 + 15  # timeout_s + 30 s, plus start-up of torchrun and 2 ranks
    message = proc.stderr.replace("\n", " ")
    assert "stalled: rank 1 at step 5" in message and "stall_train.py" in message
    records = {
        int(p.stem[4:]): json.loads(p.read_text()) for p in (run_dir / "stacks").glob("rank*.json")
    }
    assert records[1]["waiting_in_torch"] is False
    assert (
        "time.sleep" in (run_dir / "stacks" / "rank1.txt").read_text()
        or "stall_train.py" in (run_dir / "stacks" / "rank1.txt").read_text()
    )
