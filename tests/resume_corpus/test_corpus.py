"""The corpus of foreign loop shapes (``tests/resume_corpus/*.py``), each proven restart-safe.

    pytest -m examples tests/resume_corpus      # parity; verify-resume at 2 ranks (and 1 for three)
    pytest -m kill_trials tests/resume_corpus   # the kill trials, and verify-resume at 1 rank

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
from typing import Any

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


ONE_RANK_IN_CI = {"forward_forward", "mingpt_trainer", "style_transfer"}
"""Shapes verified at one rank in CI too (the examples target): full-batch training, a trainer
with its own clipping and decay groups, two models stepped in one round, whose one-process loop
(no data-parallel wrapper) is what the loop-core fixes changed. Every other shape's one-rank case
runs with the kill trials (``make kill-trials``); at two ranks the same script goes through the
same loop core plus the data-parallel split."""


def _ranks() -> list[Any]:
    return [
        pytest.param(shape, 1, id=f"{shape.name}-1", marks=_one_rank_mark(shape))
        for shape in SHAPES.values()
    ] + [
        pytest.param(shape, 2, id=f"{shape.name}-2", marks=pytest.mark.examples)
        for shape in SHAPES.values()
    ]


def _one_rank_mark(shape: Shape) -> Any:
    return pytest.mark.examples if shape.name in ONE_RANK_IN_CI else pytest.mark.kill_trials


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("shape", "nproc"), _ranks())
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
