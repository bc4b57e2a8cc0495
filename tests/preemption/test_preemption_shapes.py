"""A preemption signal that lands between an optimizer step and the script's post-step code (an
EMA update, a counter, a scheduler stepped by hand), or between two models' steps with a second
loader read by ``next()``: the save waits for a consistent point, and the rerun ends as a run
never interrupted, bit for bit (``shapes.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

SHAPES = Path(__file__).with_name("shapes.py")


def run_shape(run_dir: Path, shape: str, *args: str) -> tuple[int, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(SHAPES), str(run_dir), shape, *args],
        env=env, capture_output=True, text=True, timeout=180, start_new_session=True,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    if isinstance(a, dict):
        return [d for k in a for d in differences(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, torch.Tensor):
        return [] if torch.equal(a, b) else [where]
    return [] if a == b else [where]


@pytest.mark.parametrize(
    "shape,at",
    [
        ("own", "5"),
        ("own_accum", "3"),
        ("two_loaders", "5"),
        ("two_loaders", "0"),
        ("own_epochs", "5"),
    ],
)
def test_the_rerun_of_a_preempted_loop_matches_an_uninterrupted_one(
    shape: str, at: str, tmp_path: Path
) -> None:
    code, out = run_shape(tmp_path / "reference", shape)
    assert code == 0, out[-3000:]
    code, out = run_shape(tmp_path / "preempted", shape, "--signal-at", at)
    assert code == 75, out[-3000:]
    assert "preempted at step" in out
    step = int(out.split("preempted at step ")[1].split(":")[0])
    if shape == "own_epochs":  # its own batches: only the epoch's end (6 steps) is safe
        assert step == 6, out[-3000:]
    code, out = run_shape(tmp_path / "preempted", shape, "--signal-at", at)  # the same command
    assert code == 0, out[-3000:]
    assert "was preempted: resuming it" in out
    final = [torch.load(tmp_path / d / "final.pt") for d in ("reference", "preempted")]
    assert differences(*final) == []


def test_a_signal_after_the_loop_is_named_at_close(tmp_path: Path) -> None:
    code, out = run_shape(tmp_path, "own", "--signal-after-loop")
    assert code == 0, out[-3000:]
    assert "came after the training loop's last safe point" in out


def test_a_signal_to_every_process_of_the_job_spares_the_loader_workers(tmp_path: Path) -> None:
    """SIGTERM to the whole process group (the training process and its DataLoader workers,
    as a scheduler sends it): the workers ignore it, the training process saves and stops."""
    args = ("--workers", "2", "--signal-at", "2", "--to-group")
    code, out = run_shape(tmp_path / "reference", "accum", "--workers", "2")
    assert code == 0, out[-3000:]
    code, out = run_shape(tmp_path / "preempted", "accum", *args)
    assert code == 75, out[-3000:]
    assert "DataLoader worker" not in out
    code, out = run_shape(tmp_path / "preempted", "accum", *args)
    assert code == 0, out[-3000:]
    final = [torch.load(tmp_path / d / "final.pt") for d in ("reference", "preempted")]
    assert differences(*final) == []
