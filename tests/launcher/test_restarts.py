"""A rank SIGKILLed mid-training: with restarts the job resumes and ends bit-identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from benchmarks.chaos import final_weights, launch

pytestmark = pytest.mark.dist


@pytest.mark.e2e
def test_killed_ranks_restart_resume_and_match(tmp_path: Path) -> None:
    reference = launch(tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = final_weights(tmp_path / "reference")
    for rank, step in [(1, 7), (0, 22)]:
        run_dir = tmp_path / f"kill-{rank}-{step}"
        proc = launch(run_dir, "--kill-rank", str(rank), "--kill-step", str(step))
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = final_weights(run_dir)
        assert all(torch.equal(got[k], expected[k]) for k in expected)
        restarts = [json.loads(x) for x in (run_dir / "restarts.jsonl").read_text().splitlines()]
        assert [(r["restart"], r["resumed"]) for r in restarts] == [(1, True)]
        assert restarts[0]["step"] == step // 2 * 2  # the newest checkpoint before the kill


def test_without_restarts_a_dead_rank_ends_the_job_with_its_name(tmp_path: Path) -> None:
    proc = launch(tmp_path / "job", "--kill-rank", "1", "--kill-step", "3", max_restarts=0)
    assert proc.returncode == 128 + 9  # the rank's own end: SIGKILL
    message = proc.stderr.replace("\n", " ")
    assert "rank 1 (local rank 1) was killed by SIGKILL" in message
    assert "--max-restarts" in message and "ChildFailedError" not in message
    # The ranks' own output stays ([rankN]: ...); torchrun's own traceback is left out.
    assert not any(line.startswith("Traceback") for line in proc.stderr.splitlines())
