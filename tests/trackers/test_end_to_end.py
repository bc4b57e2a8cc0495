"""All three trackers together under `paratrain run --nproc 2 --max-restarts 1`: a rank is
SIGKILLed after the save at step 3 (or before it, at step 2), torchrun restarts the job, it
resumes on its own (or starts over), and each tracker ends with one run that the restart
continued (make scale-test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trackers.records import mlflow_client, tensorboard_scalars, wandb_runs

pytestmark = pytest.mark.scale
SCRIPT = Path(__file__).with_name("tracked_train.py")
STEPS = 8  # 2 epochs of 64 samples, per-rank batch 8, 2 ranks


def _run(run_dir: Path, kill_step: int) -> None:
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
    cmd += ["--run-dir", str(run_dir), str(SCRIPT), "--kill-step", str(kill_step)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def test_a_restarted_job_continues_every_tracker_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _run(run_dir, kill_step=5)
    (restart,) = [
        json.loads(line) for line in (run_dir / "restarts.jsonl").read_text().splitlines()
    ]
    assert restart["resumed"] and restart["step"] == 3

    client = mlflow_client((run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("paratrain").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["extra.lr"] == "0.05" and run.data.params["world_size"] == "2"
    points = {(m.step, int(m.value)) for m in client.get_metric_history(run.info.run_id, "attempt")}
    assert {(s, 0) for s in (1, 2, 3)} <= points
    assert {s for s, a in points if a == 1} == set(range(4, STEPS + 1))

    first, *_, last = wandb_runs(run_dir)
    assert first.id == last.id and first.config["extra"]["script"] == "tracked_train"
    assert [row["step"] for row in last.history] == list(range(4, STEPS + 1))
    assert {row["attempt"] for row in last.history} == {1}

    shown = tensorboard_scalars(run_dir / "tensorboard", "attempt")
    assert shown == [(s, 0.0) for s in (1, 2, 3)] + [(s, 1.0) for s in range(4, STEPS + 1)]


def test_a_job_restarted_before_its_first_save_continues_every_tracker_run(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    _run(run_dir, kill_step=2)  # the first save is at step 3: nothing to resume
    (restart,) = [
        json.loads(line) for line in (run_dir / "restarts.jsonl").read_text().splitlines()
    ]
    assert not restart["resumed"] and restart["step"] == 0

    client = mlflow_client((run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("paratrain").experiment_id])
    assert run.info.status == "FINISHED"  # one run, continued: no second one beside it
    points = {(m.step, int(m.value)) for m in client.get_metric_history(run.info.run_id, "attempt")}
    assert {s for s, a in points if a == 1} == set(range(1, STEPS + 1))

    first, *_, last = wandb_runs(run_dir)
    assert first.id == last.id
    shown = tensorboard_scalars(run_dir / "tensorboard", "attempt")
    assert shown == [(s, 1.0) for s in range(1, STEPS + 1)]  # each step once, from the restart
