"""The corpus of foreign loop shapes (``tests/resume_corpus/*.py``), each proven restart-safe.

    pytest -m examples tests/resume_corpus    # parity and verify-resume: 25 min on 2 busy cores
    pytest -m scale tests/resume_corpus       # the kill trials: 12 min there

Every script is a small port, by the README and docs/tutorials/port-ddp-tutorial.md, of a
well-known public training script's loop (its module docstring names the original and the shape
it exercises):

- parity: a port with a hand-written plain-torch original (``<name>_original.py``) ends with the
  original's weights, bit for bit, in one process;
- verify-resume: ``paratrain verify-resume --nproc N --kills 4 --json`` passes every script at 1
  and 2 ranks and fails ``broken_untracked_counter.py``, naming the model weights that differ;
- kill trials (``scale``), written before verify-resume existed and kept as a check of it that
  does not go through ``pt.Run``'s fault injection: a run killed once (SIGKILL on the last rank
  by ``killer.py``, after 60 % of its optimizer steps) and restarted by ``--max-restarts 1`` ends
  with the uninterrupted run's newest checkpoint (every tensor, every value of ``trainer.pt``) and
  the files the script writes into its run dir.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.resume_corpus.support import (
    SHAPES,
    Shape,
    environment,
    failure,
    kill_trial,
    model_keys,
    parity,
)

ORIGINALS = [shape for shape in SHAPES.values() if shape.original]
BROKEN_WEIGHTS = ("0.weight", "0.bias", "2.weight", "2.bias")
"""The parameters of broken_untracked_counter.py's model, one of which verify-resume must name."""


def name(shape: Shape) -> str:
    return shape.name


@pytest.mark.examples
@pytest.mark.parametrize("shape", ORIGINALS, ids=name)
def test_one_process_port_ends_with_the_originals_weights(shape: Shape, tmp_path: Path) -> None:
    assert parity(shape, tmp_path) is None


@pytest.mark.examples
@pytest.mark.timeout(900)
@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=name)
def test_verify_resume(shape: Shape, nproc: int, tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "paratrain",
        "verify-resume",
        "--nproc",
        str(nproc),
        "--kills",
        "4",
        "--json",
        "--run-dir",
        str(tmp_path / "verify"),
    ]
    if shape.compare_files:
        command += ["--compare-files", shape.compare_files]
    command += [str(shape.script), *shape.args]
    proc = subprocess.run(
        command, cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=880
    )
    (tmp_path / "report.json").write_text(proc.stdout)
    if shape.restart_safe:
        assert proc.returncode == 0, failure(proc)
        assert json.loads(proc.stdout)["exit_code"] == 0
    else:
        assert proc.returncode == 1, failure(proc)
        assert any(key in proc.stdout for key in BROKEN_WEIGHTS), failure(proc)


@pytest.mark.kill_trials
@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=name)
def test_killed_and_restarted_run_ends_as_the_uninterrupted_one(
    shape: Shape, nproc: int, tmp_path: Path
) -> None:
    trial = kill_trial(shape, nproc, tmp_path)
    assert trial.resumed_step is not None, "the restarted run did not resume from a checkpoint"
    if shape.restart_safe:
        assert trial.difference is None, (
            f"{shape.name} at {nproc} rank(s), killed after optimizer step {trial.kill_step} of "
            f"{trial.steps}, resumed at step {trial.resumed_step}: {trial.difference}"
        )
    else:
        assert trial.difference is not None and model_keys(trial.difference), trial.difference
