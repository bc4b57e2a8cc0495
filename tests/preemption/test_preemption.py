"""A preemption signal becomes a checkpoint at the step reached and exit code 75; running the
same command again ends bit-identical to a run that was never interrupted.

Real processes: the loop in ``job.py`` (one process here, ``paratrain run --nproc 2`` in
``test_preemption_distributed.py``), signalled from outside once it has taken 3 steps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from paratrain.config import RunConfig
from paratrain.errors import ConfigError

JOB = Path(__file__).with_name("job.py")


def start(run_dir: Path, *args: str, launcher: list[str] | None = None) -> subprocess.Popen[str]:
    """``job.py`` in its own process (``launcher`` in front, e.g. ``paratrain run --nproc 2``)."""
    command = [*(launcher or [sys.executable]), str(JOB), str(run_dir), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_started(proc: subprocess.Popen[str], run_dir: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (run_dir / "started").exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the job never took its third step"
        time.sleep(0.05)


def finish(proc: subprocess.Popen[str], timeout_s: float = 180.0) -> tuple[int, str]:
    """The exit code and everything printed (stdout, then stderr)."""
    out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, out + err


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "final.pt", weights_only=True)


def assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    run_dir = tmp_path_factory.mktemp("reference")
    code, err = finish(start(run_dir))
    assert code == 0, err[-3000:]
    return weights(run_dir)


def test_sigterm_saves_at_the_step_reached_and_the_rerun_matches(
    tmp_path: Path, uninterrupted: dict[str, torch.Tensor]
) -> None:
    proc = start(tmp_path, "--sleep", "0.05")
    wait_started(proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 75, err[-3000:]
    assert "preempted at step" in err and "saved" in err
    step = int(err.split("preempted at step ")[1].split(":")[0])
    assert 3 <= step < 96 and step % 32 != 0  # mid-epoch: no save was due
    assert (tmp_path / "checkpoints" / f"step-{step:08d}").is_dir()
    code, err = finish(start(tmp_path, "--sleep", "0.05"))  # the same command: resumes by itself
    assert code == 0, err[-3000:]
    assert f"resumed from {tmp_path / 'checkpoints' / f'step-{step:08d}'}" in err.replace("\n", "")
    assert_equal(weights(tmp_path), uninterrupted)


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    proc = start(tmp_path, "--sleep", "0.05", "--slow-save", "30")
    wait_started(proc, tmp_path)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(1.0)  # the save is under way (slowed down)
    proc.send_signal(signal.SIGUSR1)
    code, err = finish(proc)
    assert code == -signal.SIGUSR1, err[-3000:]
    assert "preempted at step" not in err


def test_a_save_past_the_grace_period_is_abandoned_and_the_previous_one_stays(
    tmp_path: Path,
) -> None:
    proc = start(tmp_path, "--sleep", "0.05", "--slow-save", "30", "--grace", "1", "--epochs", "9")
    while not list((tmp_path / "checkpoints").glob("step-*")):  # the first epoch's save
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    code, err = finish(proc)
    assert code == 75, err[-3000:]
    assert time.monotonic() - started < 15  # well before the 30 s save would have ended
    assert "did not finish within 1 s of the signal and was abandoned" in err.replace("\n", " ")
    assert [p.name for p in (tmp_path / "checkpoints").glob("step-*")] == ["step-00000032"]
    # job.py never calls run.resume(): the rerun resumes the newest all the same, as promised
    rerun = start(tmp_path, "--sleep", "0.05", "--slow-save", "30", "--grace", "1", "--epochs", "9")
    code, out = finish(rerun)
    assert code == 0, out[-3000:]
    assert "was preempted: resuming it" in out and "step 32" in out


def test_without_preempt_signals_sigterm_ends_the_process(tmp_path: Path) -> None:
    proc = start(tmp_path, "--sleep", "0.05", "--no-signals")
    wait_started(proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == -signal.SIGTERM and "preempted" not in err


@pytest.mark.parametrize("value", [("SIGKILL",), ("SIGINT",), ("NOPE",), "SIGTERM", (15,)], ids=str)
def test_bad_signal_settings_name_the_fix(value: object) -> None:
    with pytest.raises(ConfigError, match="preempt_signals"):
        RunConfig(preempt_signals=value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="preempt_grace_s"):
        RunConfig(preempt_grace_s=0)
