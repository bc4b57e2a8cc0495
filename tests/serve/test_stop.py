"""``docker stop`` of a training container: SIGTERM through ``paratrain serve CMD`` (which execs
the command) reaches every rank, which save at the step reached and stop (exit 75, preempted);
the checkpoint folder holds only complete checkpoints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paratrain.checkpoint.inspection import verify

SAVER = Path(__file__).with_name("saver.py")


@pytest.mark.dist
def test_sigterm_mid_training_leaves_only_complete_checkpoints(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    proc = subprocess.Popen(
        [sys.executable, "-m", "paratrain", "serve", sys.executable, "-m", "paratrain", "run",
         "--nproc", "2", "--backend", "gloo", "--run-dir", str(run_dir), str(SAVER),
         str(tmp_path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        done = [p for p in checkpoints.glob("step-*") if (p / "manifest.json").exists()]
        if len(done) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    time.sleep(0.15)  # into the next save
    proc.send_signal(signal.SIGTERM)  # what `docker stop` sends to the entrypoint
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 75, output[-3000:]  # paratrain run: preempted, saved
    assert "paratrain run: preempted by SIGTERM at step" in output
    for rank in (0, 1):
        with pytest.raises(ProcessLookupError):
            os.kill(int((tmp_path / f"rank{rank}.pid").read_text()), 0)
    ok, lines = verify(checkpoints)
    assert ok and lines and all(line.startswith("ok: ") for line in lines), lines
    committed = sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith("."))
    assert len(committed) == len(lines) >= 3
