"""``paratrain verify-resume`` end to end: real runs under torchrun, killed with SIGKILL."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from paratrain.commands.cli import main
from paratrain.commands.verify.kill_points import KINDS
from paratrain.core.faults import EVENTS

SCRIPTS = Path(__file__).with_name("scripts")


def verify_resume(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m paratrain verify-resume ARGS`` in ``cwd``."""
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "paratrain", "verify-resume", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"},
        timeout=400,
    )


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _kinds_in_trace(run_dir: Path) -> collections.Counter[str]:
    lines = (run_dir / "straight-1" / "verify-resume" / "trace").glob("rank*.jsonl")
    return collections.Counter(
        json.loads(line)["event"] for path in lines for line in path.read_text().splitlines()
    )


@pytest.mark.dist
@pytest.mark.e2e
def test_a_restart_safe_script_passes_at_two_ranks_killed_at_every_kind(tmp_path: Path) -> None:
    script = str(SCRIPTS / "restart_safe.py")
    proc = verify_resume("--nproc", "2", "--kills", "7", "--json", script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    report = _json(proc)
    runs = report["runs"]
    assert [r["event"] for r in runs] == list(KINDS)
    assert {r["rank"] for r in runs} == {0, 1}
    assert all(r["result"] == "match" and r["first_difference"] is None for r in runs), runs
    assert report["deterministic"] is True and report["exit_code"] == 0
    by_event = {r["event"]: r for r in runs}
    assert by_event["save_write"]["rank"] == 0  # only the main process writes the checkpoint
    # Killed before the save committed: resumed from the save before it.
    assert by_event["save_write"]["resumed_from"] < by_event["save_write"]["step"]
    assert by_event["saved"]["resumed_from"] == by_event["saved"]["step"]
    assert report["total_s"] > report["straight_run_s"] > 0
    restarts = (tmp_path / "runs/verify-resume/kill-1-mid_window/restarts.jsonl").read_text()
    assert json.loads(restarts.splitlines()[0])["resumed"] is True


@pytest.mark.dist
@pytest.mark.e2e
def test_a_restart_safe_script_passes_at_one_rank(tmp_path: Path) -> None:
    script = str(SCRIPTS / "restart_safe.py")
    proc = verify_resume(
        "--kills", "2", "--seed", "1", "--compare-files", "*.pt",
        "--run-dir", "out", script, "--epochs", "3", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "every killed run ended as the uninterrupted run, bit for bit" in proc.stdout
    assert "uninterrupted run" in proc.stdout and "x one run" in proc.stdout
    assert set(_kinds_in_trace(tmp_path / "out")) == set(EVENTS)
    assert (tmp_path / "out/straight-1/best.pt").is_file()  # compared too
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "kill-1-mid_window", "kill-2-step", "straight-1", "straight-2",
    ]  # fmt: skip


@pytest.mark.dist
@pytest.mark.e2e
def test_an_untracked_counter_is_found_and_the_weights_named(tmp_path: Path) -> None:
    script = str(SCRIPTS / "untracked_counter.py")
    proc = verify_resume("--kills", "1", "--json", script, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-4000:]
    [run] = _json(proc)["runs"]
    assert run["result"] == "DIFFERS"
    assert run["resumed_from"] == 6
    difference = run["first_difference"]
    assert difference["path"] == "rank 0/models/model/0.weight"
    assert difference["max_abs"] > 0 and difference["detail"].startswith("max |Δ| ")


@pytest.mark.dist
def test_a_script_seeded_from_the_time_is_reported_as_not_deterministic(tmp_path: Path) -> None:
    proc = verify_resume(str(SCRIPTS / "seeded_from_time.py"), cwd=tmp_path)
    assert proc.returncode == 1
    text = " ".join(proc.stdout.split())
    assert "the script is not deterministic" in text
    assert "rank 0/models/model/weight: max |Δ|" in text
    assert "a seed taken from the time" in text
    assert not (tmp_path / "runs/verify-resume/kill-1-step").exists()  # nothing was killed


@pytest.mark.dist
@pytest.mark.parametrize(
    "args,needle",
    [
        (["own_dirs.py", "ckpt_dir", "/tmp/fixed-checkpoints"], "sets ckpt_dir='/tmp/fixed"),
        (["own_dirs.py", "run_dir", "elsewhere"], "sets its own run_dir="),
        (["no_run.py"], "without creating paratrain.Run"),
        (["exits_hard.py"], "ended without rank 0 writing its final state"),
        (["--compare-files", "nothing.pt", "seeded_from_time.py"], "matched no file"),
    ],
)
def test_scripts_that_cannot_be_verified_are_usage_errors(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    flags = args[:2] if args[0].startswith("--") else []
    script, *rest = args[len(flags) :]
    proc = verify_resume(*flags, str(SCRIPTS / script), *rest, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert needle in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


@pytest.mark.dist
def test_a_failing_script_is_reported_with_its_output(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("raise SystemExit('the data folder is missing')\n")
    proc = verify_resume(str(script), cwd=tmp_path)
    assert proc.returncode == 1
    text = " ".join(proc.stdout.split())
    assert "failed on its own (rank 0 (local rank 0) exited with code 1)" in text
    assert "the data folder is missing" in text
    assert "ChildFailedError" not in text


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--kills", "0", "x.py"], "--kills: 0 must be at least 1"),
        (["--atol", "-0.5", "x.py"], "--atol: -0.5 must be a finite number of 0 or more"),
        (["--atol=-1e-3", "x.py"], "--atol: -1e-3 must be a finite number of 0 or more"),
        (["--atol", "nan", "x.py"], "--atol: nan must be a finite number"),
        (["--nproc", "0", "x.py"], "--nproc: 0 must be at least 1"),
        ([], "Nothing to verify"),
        (["missing.py"], "Script missing.py not found"),
        (["--compare-files", "/abs/*.pt", "x.py"], "must be a pattern relative to each run dir"),
    ],
)
def test_usage_errors_exit_2_with_a_message(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["verify-resume", *argv])
    assert exit_info.value.code == 2
    assert needle in " ".join(capsys.readouterr().err.split())


@pytest.mark.dist
@pytest.mark.e2e
def test_full_batch_training_with_per_rank_extras_passes_at_two_ranks(tmp_path: Path) -> None:
    """Data read once before a ``while`` loop, and a per-rank best loss in the extras: no
    warning about an epochs loop the script does not have, and every kill resumes exactly."""
    script = str(SCRIPTS / "full_batch.py")
    proc = verify_resume("--nproc", "2", "--kills", "3", "--json", script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    report = _json(proc)
    assert all(r["result"] == "match" for r in report["runs"]), report["runs"]
    log = (tmp_path / "runs/verify-resume/straight-1/verify-resume/output.log").read_text()
    assert "run.epochs" not in log


@pytest.mark.dist
@pytest.mark.e2e
def test_a_script_safe_against_sigkill_but_not_preemption_fails(tmp_path: Path) -> None:
    """The learning rate comes from enumerate(loader): SIGKILLs resume at epoch starts and
    match; the preemption kill saves mid-epoch, and the rerun differs."""
    script = str(SCRIPTS / "lr_from_enumerate.py")
    proc = verify_resume("--kills", "4", "--json", script, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-4000:]
    runs = {r["event"]: r for r in _json(proc)["runs"]}
    assert runs["preempt"]["result"] == "DIFFERS"
    assert runs["preempt"]["first_difference"]["path"].startswith("rank 0/models/model/")
    assert all(r["result"] == "match" for kind, r in runs.items() if kind != "preempt")
