"""Injected hangs under `paratrain run --nproc 2`: each is named (kind, rank, line) within seconds
of the stall, and the job ends with exit 124. The full table (13 kinds at 2 and 4 ranks, the
default threshold) is benchmarks/hang_table.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("hang_job.py")
PREEMPTIBLE = ("loop", "queue")
"""Kinds run with the job's preemption signals caught (the others with ``--no-preempt``)."""


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("kind", "named"),
    [
        ("order", "mismatched collectives"),
        ("loop", "never reached: rank(s) 1 never reached"),
        ("queue", "never reached: rank(s) 1 never reached"),
        ("two_groups", "two process groups"),
    ],
)
def test_a_hang_is_named_in_seconds(kind: str, named: str, tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "paratrain", "run", "--nproc", "2", "--run-dir",
         str(tmp_path / "run"), str(JOB), kind, "--stall-s", "5",
         *([] if kind in PREEMPTIBLE else ["--no-preempt"])],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 124, done.stderr[-3000:]
    summary = " ".join(done.stderr.split("the job failed:")[-1].split())
    assert summary.startswith(f"stalled: {named}"), summary
    assert "hang_job.py:" in summary  # the line
    assert took < 90, took  # 5 s of stall, start-up and teardown
    assert (tmp_path / "run" / "stacks" / "diagnosis.json").exists()
    if kind in PREEMPTIBLE:
        # The stuck rank catches SIGTERM for preemption; the launcher's SIGTERM after a named
        # hang is no preemption: it writes its own stack and exits at once (it used to wait for
        # a safe point it never reached, until torchrun killed it 30 s later, stack unwritten).
        own = json.loads((tmp_path / "run" / "stacks" / "rank1.json").read_text())
        assert "hang_job.py:" in own["where"], own
        assert "rank 1 made no progress" in done.stderr
