"""One run of the script under ``paratrain run``'s torchrun command, with the verify settings.

    files = RunFiles(Path("runs/verify-resume/kill-1"))
    result = launch(["train.py", "--lr", "3e-4"], nproc=2, files=files, kill=point)
    result.code, result.seconds, result.tail(), result.report    # report: what the Run resolved

The command is the launcher's own (:func:`paratrain.commands.run.plan.make_plan`), with
``--max-restarts 1`` when a rank is to be killed, so torchrun restarts it exactly as
``paratrain run --max-restarts 1`` does and ``pt.Run`` resumes by itself. The variables of
:mod:`paratrain.core.faults` and :mod:`paratrain.runtime.final_state` go to the ranks; the output
goes to ``verify-resume/output.log`` inside the run dir.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paratrain.commands.run.failure import failure_summary
from paratrain.commands.run.plan import LaunchPlan, RunOptions, make_plan
from paratrain.commands.run.supervise import AgentNoise
from paratrain.core.faults import KillPoint
from paratrain.distributed.environment import FINAL_STATE_VAR, KILL_VAR, TRACE_VAR, read_report

TAIL_LINES = 40


@dataclass(frozen=True)
class RunFiles:
    """Where one verify run writes: the run dir, and verify-resume's own files inside it."""

    run_dir: Path

    @property
    def own(self) -> Path:
        """verify-resume's folder inside the run dir."""
        return self.run_dir / "verify-resume"

    @property
    def trace(self) -> Path:
        """``PARATRAIN_TRACE``: ``rank<r>.jsonl`` per rank."""
        return self.own / "trace"

    @property
    def final_state(self) -> Path:
        """``PARATRAIN_FINAL_STATE``: ``rank<r>.pt`` per rank."""
        return self.own / "final"

    @property
    def output(self) -> Path:
        """Everything the run printed (torchrun and every rank)."""
        return self.own / "output.log"

    @property
    def report(self) -> Path:
        """``PARATRAIN_REPORT``: the run dir and checkpoint dir the script's Run resolved."""
        return self.own / "report.json"


@dataclass(frozen=True)
class RunResult:
    """How one run ended."""

    files: RunFiles
    code: int
    """torchrun's exit code (negative: the signal that ended it)."""
    seconds: float
    timed_out: bool
    report: dict[str, Any] | None
    """What the script's Run reported (None: it never created one)."""

    def output(self) -> str:
        """Everything the run printed ("" if nothing could be read)."""
        try:
            return self.files.output.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` lines of the run's output, without torchrun's own traceback and
        failure table (as ``paratrain run`` shows it)."""
        noise = AgentNoise()
        kept = [shown for line in self.output().splitlines(True) for shown in noise.feed(line)]
        return "\n".join("".join(kept + noise.flush()).splitlines()[-lines:])

    def failure(self) -> str:
        """How the run ended: ``rank 1 (local rank 1) was killed by SIGKILL``, or its code."""
        if self.timed_out:
            return "it did not end in time and was stopped"
        return failure_summary(self.output()) or f"torchrun exited with code {self.code}"


def plan_for(
    target: list[str], *, nproc: int, run_dir: Path, max_restarts: int, report: Path | None = None
) -> LaunchPlan:
    """The launcher's torchrun command for ``target`` (checks the script and flags)."""
    import torch

    options = RunOptions(
        target=target,
        nproc=str(nproc),
        max_restarts=max_restarts,
        run_dir=run_dir,
        report=report,
    )
    return make_plan(options, env=os.environ, gpus=torch.cuda.device_count())


def launch(
    target: list[str],
    *,
    nproc: int,
    files: RunFiles,
    kill: KillPoint | None = None,
    timeout_s: float | None = None,
) -> RunResult:
    """Run ``target`` to its end (a fresh run dir); with ``kill``, one rank dies on the way."""
    shutil.rmtree(files.run_dir, ignore_errors=True)  # a previous verify's run of this name
    files.own.mkdir(parents=True)
    plan = plan_for(
        target,
        nproc=nproc,
        run_dir=files.run_dir,
        max_restarts=1 if kill else 0,
        report=files.report,
    )
    env = _environment(plan, files, kill)
    started = time.perf_counter()
    with files.output.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(plan.argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        code, timed_out = _wait(proc, timeout_s)
    return RunResult(
        files=files,
        code=code,
        seconds=time.perf_counter() - started,
        timed_out=timed_out,
        report=read_report(files.report),
    )


def _environment(plan: LaunchPlan, files: RunFiles, kill: KillPoint | None) -> dict[str, str]:
    env: dict[str, str] = {k: v for k, v in os.environ.items() if k != KILL_VAR}
    env.update(plan.env)
    env[TRACE_VAR] = str(files.trace.resolve())
    env[FINAL_STATE_VAR] = str(files.final_state.resolve())
    if kill is not None:
        env[KILL_VAR] = str(kill)
    return env


def _wait(proc: subprocess.Popen[bytes], timeout_s: float | None) -> tuple[int, bool]:
    """(exit code, timed out). Past the timeout (or on Ctrl-C) torchrun is asked to stop its
    ranks with SIGTERM, and killed if it has not within 30 s."""
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        _stop(proc)
        return proc.returncode, True
    except KeyboardInterrupt:
        _stop(proc)
        raise


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def reported_dirs(report: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """(run dir, checkpoint dir) from a Run's report, as text (None: not reported)."""
    if report is None:
        return None, None
    run_dir, ckpt_dir = report.get("run_dir"), report.get("ckpt_dir")
    return (
        run_dir if isinstance(run_dir, str) else None,
        ckpt_dir if isinstance(ckpt_dir, str) else None,
    )
