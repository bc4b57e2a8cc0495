"""``paratrain demo`` end to end: torchrun, 2 gloo ranks, a crash and its resume compared with an
uninterrupted run, the weights reloaded in a fresh process, the curves plotted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from paratrain.commands.demo.digits import DigitsCNN
from paratrain.commands.demo.records import read_records
from paratrain.commands.monitor.snapshot import snapshot
from tests.support.images import png_size

pytestmark = pytest.mark.dist


def _demo(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    demo = [sys.executable, "-m", "paratrain", "demo", "--nproc", "2", "--no-progress"]
    proc = subprocess.run(
        [*demo, "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.e2e
def test_demo_crashes_resumes_exactly_and_reaches_the_target(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    started = time.perf_counter()
    code, out, err = _demo(run_dir)
    wall = time.perf_counter() - started
    assert code == 0, out + err
    result = json.loads((run_dir / "train_result.json").read_text())
    assert result["world_size"] == 2 and result["strategy"] == "ddp"
    assert result["test_accuracy"] >= 0.95  # the default epochs reach the target
    assert result["test_samples"] == 359  # every held-out sample exactly once over 2 ranks
    # Rank 1 died in epoch 7 of 12; torchrun's restart resumed from epoch 6's checkpoint.
    assert result["restarts"] == 1 and result["resumed_from"].endswith("step-00000138")
    assert "rank 1 will kill itself (SIGKILL) halfway through this epoch" in out
    assert "paratrain: resumed from" in out and "Traceback" not in out + err
    assert "rank 1 killed in epoch 7 after step 149" in out
    assert "the 11 steps run twice gave the same losses both times, bit for bit" in out
    assert "all 276 step losses and the final weights equal those of an uninterrupted run" in out
    assert "result       OK: test accuracy" in out
    # What the demo compared, compared here again: the uninterrupted run's weights.
    resumed = torch.load(run_dir / "model.pt", weights_only=True, map_location="cpu")
    straight = torch.load(run_dir / "reference" / "model.pt", weights_only=True)
    assert resumed.keys() == DigitsCNN().state_dict().keys()
    assert all(torch.equal(resumed[k], straight[k]) for k in resumed)
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == [
        "step-00000253",
        "step-00000276",
    ]  # a checkpoint per epoch, the newest 2 kept
    # Only the main process prints the epoch lines (the reference's go to its output.log).
    assert out.count("epoch 12/12") == 1
    assert "epoch 12/12" in (run_dir / "reference" / "output.log").read_text()
    _check_progress_lines(out)
    _check_times(out, run_dir, wall)
    width, height = png_size(run_dir / "curves.png")
    assert width > 500 and height > 200
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


def _check_progress_lines(out: str) -> None:
    """The demo says what it does before each slow part, starting before torch is loaded."""
    lines = out.splitlines()
    assert lines[0].startswith("paratrain demo: checking the settings")
    order = [
        "paratrain demo: starting the ranks",
        "epoch  1/12",
        "paratrain demo: training done",
        "paratrain demo: reloading the saved weights in a fresh CPU process",
        "paratrain demo: checking the resume",
        "paratrain demo: plotting the curves",
        "  result",
    ]
    found = [next(i for i, line in enumerate(lines) if line.startswith(o)) for o in order]
    assert found == sorted(found)


def _check_times(out: str, run_dir: Path, wall: float) -> None:
    """ "trained in" is the epochs' training passes timed in the ranks, not the wall time."""
    trained = re.search(r"276 steps in ([\d.]+) s \(the training passes", out)
    total = re.search(r"time\s+([\d.]+) s in all", out)
    assert trained and total, out
    records = read_records(run_dir / "metrics.jsonl")
    assert float(trained.group(1)) == pytest.approx(records.train_seconds, abs=0.051)
    assert 0 < float(trained.group(1)) < float(total.group(1)) <= wall


def test_too_few_epochs_says_so_and_exits_0(tmp_path: Path) -> None:
    run_dir = tmp_path / "short"
    code, out, err = _demo(run_dir, "--epochs", "2", "--skip-resume")
    assert code == 0, out + err
    assert "2 epochs were too few to reach the target 0.95" in out
    assert "The default, 12 epochs, reaches it: run `paratrain demo` without --epochs" in out
    assert "resume       not shown (--skip-resume)" in out and "BELOW" not in out
    assert not (run_dir / "reference").exists()
    result = json.loads((run_dir / "train_result.json").read_text())
    assert result["restarts"] == 0 and result["steps"] == 46
    # The runtime's per-rank stats, as `paratrain monitor` reads them.
    snap = snapshot(run_dir)
    assert [r["rank"] for r in snap["ranks"]] == [0, 1]
    assert snap["ranks"][0]["step"] == snap["ranks"][1]["step"] == 40  # every 10 of 46 steps


def test_a_crashed_rank_is_a_failure(tmp_path: Path) -> None:
    # A crash the demo did not plan (verify-resume's fault injection), with no restart to recover.
    run_dir = tmp_path / "crash"
    code, out, err = _demo(
        run_dir, "--epochs", "1", "--skip-resume", env={"PARATRAIN_KILL": "step:3:1"}
    )
    assert code not in (0, 2), out + err
    assert "The demo's training ranks failed" in err
    assert "result" not in out
