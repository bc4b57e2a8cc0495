"""The processes ``paratrain demo`` starts: the training job (torchrun, N ranks) and the reload.

    job = TrainingJob(options, files, nproc=2, gpus=0)
    argv, env = job.command(crash_in_epoch=7)  # torchrun restarts the ranks once
    job.run_quietly(say=print)                 # output to DIR/output.log, one mark per epoch
    reload(files.weights)                      # {"test_accuracy": ..., "test_samples": ...}

The torchrun command is the launcher's own (:func:`paratrain.commands.run.plan.make_plan`). Every
process started here imports torch afresh, which is most of the demo's wall time on a CPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paratrain.commands.demo.artefacts import DemoFiles
from paratrain.commands.run.plan import RunOptions, make_plan
from paratrain.errors import JobFailedError, ParatrainError

EPOCH_LINE = re.compile(r"^epoch\s+(\d+)/\d+\s")
"""The main process's line at the end of each epoch (``epoch  3/12  loss ...``)."""


@dataclass(frozen=True, slots=True)
class JobOptions:
    """The training settings ``paratrain demo`` forwards to every rank."""

    epochs: int
    """Passes over the training set."""
    batch_size: int
    """Per-rank batch."""
    strategy: str
    """``pt.Run``'s ``strategy`` (``auto``, ``ddp``, ``fsdp``, ...)."""
    precision: str
    """``pt.Run``'s ``precision``."""
    grad_accum: int
    """Micro-batches per optimizer step."""
    progress: bool
    """Show the main process's progress bar."""

    def args(self, run_dir: Path) -> list[str]:
        """The options of ``paratrain.commands.demo.train`` for a run in ``run_dir``."""
        return [
            "--run-dir", str(run_dir), "--epochs", str(self.epochs),
            "--batch-size", str(self.batch_size), "--strategy", self.strategy,
            "--precision", self.precision, "--grad-accum", str(self.grad_accum),
        ] + ([] if self.progress else ["--no-progress"])  # fmt: skip


@dataclass(frozen=True, slots=True)
class TrainingJob:
    """The demo's training on ``nproc`` local ranks, writing into ``files``."""

    options: JobOptions
    files: DemoFiles
    nproc: int
    gpus: int

    def command(self, *, crash_in_epoch: int = 0) -> tuple[list[str], dict[str, str]]:
        """torchrun's argv and the ranks' environment; raises what the launcher refuses (too
        many CPU ranks, say). With ``crash_in_epoch``, one rank dies in that epoch and torchrun
        restarts every rank, once."""
        extra = ["--crash-in-epoch", str(crash_in_epoch)] if crash_in_epoch else []
        target = [
            "-m",
            "paratrain.commands.demo.train",
            *self.options.args(self.files.root),
            *extra,
        ]
        # One node, whatever the environment says (a Slurm allocation included): it is local.
        plan = make_plan(
            RunOptions(
                target=target,
                nproc=str(self.nproc),
                nnodes=1,
                max_restarts=1 if crash_in_epoch else 0,
                run_dir=self.files.root,
            ),
            env=os.environ,
            gpus=self.gpus,
        )
        env = {**os.environ, **plan.env}
        if self.gpus:  # bit-exact resume on GPUs needs deterministic kernels (cuBLAS's too)
            env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        return plan.argv, env

    def run_quietly(self, *, say: Callable[[str], None]) -> None:
        """Train with the output going to ``output.log`` in the run dir; ``say`` gets the number
        of each epoch as it ends. A failed job raises with the output's last lines."""
        argv, env = self.command()
        self.files.root.mkdir(parents=True, exist_ok=True)
        log = self.files.root / "output.log"
        with log.open("w", encoding="utf-8") as out:
            proc = subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                epoch = EPOCH_LINE.match(line)
                if epoch:
                    say(epoch.group(1))
            code = _wait(proc)
        if code != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise job_failed(
                code, f"The uninterrupted reference training failed; {log} ends:\n{tail}"
            )


def job_failed(code: int, message: str) -> JobFailedError:
    """The error for a torchrun that exited with ``code`` (negative: killed by that signal)."""
    return JobFailedError(
        f"{message} (torchrun exit code {code})", exit_code=code if code > 0 else 128 - code
    )


def _wait(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> int:
    """torchrun's exit code. On Ctrl-C torchrun got the same signal (one foreground process
    group) and stops its ranks: wait for that, then let the interrupt through."""
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.terminate()  # torchrun stops its ranks on SIGTERM too
            proc.wait()
        raise


def reload(weights: Path) -> dict[str, float]:
    """Test accuracy of ``weights`` measured by a fresh, single CPU process
    (``paratrain.commands.demo.evaluate``): no process group, no strategy, no GPU."""
    done = subprocess.run(
        [sys.executable, "-m", "paratrain.commands.demo.evaluate", str(weights)],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise ParatrainError(f"Reloading the saved weights failed:\n{done.stderr.strip()}")
    result: dict[str, float] = json.loads(done.stdout)
    return result
