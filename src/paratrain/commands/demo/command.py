"""``paratrain demo``: check the settings, train on N ranks (crash once, resume), reload, report.

paratrain demo [--nproc N] [--epochs 12] [--strategy auto|ddp|fsdp|...] [--run-dir DIR]
paratrain demo --skip-resume        # no crash and no uninterrupted run to compare with

Imports no torch until the command runs, so ``paratrain demo --help`` answers at once.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from paratrain.commands.cli_types import positive_int
from paratrain.commands.demo.artefacts import DemoFiles
from paratrain.commands.demo.jobs import JobOptions, TrainingJob, job_failed, reload
from paratrain.commands.demo.plot import CurvesJob, plot_curves
from paratrain.commands.demo.records import job_breakdown, read_records
from paratrain.commands.demo.resume_check import ResumeCheck, check_resume
from paratrain.commands.demo.summary import Outcome, Phase, render
from paratrain.core.paths import check_creatable, make_folder
from paratrain.errors import ConfigError, EnvironmentMismatchError

TARGET_ACCURACY = 0.95
DEFAULT_EPOCHS = 12
"""Enough for the target on 2 CPU ranks (0.978 after 12 epochs; 0.96 from epoch 5)."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain demo``."""
    p = subparsers.add_parser(
        "demo",
        help="train a small CNN on shipped digits data with DDP, crash it, resume, report",
        description="The embedded default job: DDP training on scikit-learn's digits through "
        "torchrun with a checkpoint after every epoch; one rank is killed halfway and torchrun's "
        "restart resumes from the newest checkpoint, which is then compared with an "
        "uninterrupted run, bit for bit. Exact-once evaluation, the saved weights reloaded in a "
        "fresh CPU process, curves as PNG and TensorBoard logs.",
    )
    p.add_argument(
        "--nproc",
        type=positive_int,
        default=None,
        help="ranks to launch (default: every GPU, or 2 CPU ranks without GPUs)",
    )
    p.add_argument(
        "--epochs",
        type=positive_int,
        default=DEFAULT_EPOCHS,
        help=f"passes over the training set (default {DEFAULT_EPOCHS}, which reaches the "
        f"target test accuracy {TARGET_ACCURACY}; fewer may not)",
    )
    p.add_argument(
        "--batch-size", type=positive_int, default=32, help="per-rank batch (default 32)"
    )
    p.add_argument(
        "--strategy",
        default="auto",
        help="how the ranks share the model: auto (ddp on several ranks), ddp, fsdp, ... "
        "(default auto; a name that does not exist lists them all)",
    )
    p.add_argument("--precision", default="fp32", help="fp32, bf16 or fp16 (default fp32)")
    p.add_argument(
        "--grad-accum",
        type=positive_int,
        default=1,
        help="micro-batches per optimizer step (default 1)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where to write (default: a new folder under runs/demo/)",
    )
    p.add_argument(
        "--skip-resume",
        action="store_true",
        help="leave out the resume demonstration: no rank is killed, and no second, "
        "uninterrupted training runs to compare with (saves about a third of the time)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(handler=run_demo)


def say(text: str) -> None:
    """One line of the demo's own progress."""
    print(f"paratrain demo: {text}", flush=True)


DEMO_NEEDS = {"sklearn": "scikit-learn", "matplotlib": "matplotlib", "tensorboard": "tensorboard"}
"""What the ``[demo]`` extra installs: the digits data, the plot, the logged curves."""


def check_demo_extra() -> None:
    """EnvironmentMismatchError (exit 2) naming the install line when the ``[demo]`` extra is
    missing: found in a fraction of a second, before any rank starts (no import of them)."""
    found = importlib.util.find_spec
    missing = [dist for module, dist in DEMO_NEEDS.items() if found(module) is None]
    if missing:
        raise EnvironmentMismatchError(
            f"`paratrain demo` needs {', '.join(missing)} (the [demo] extra), which "
            f"{'is' if len(missing) == 1 else 'are'} not installed here. Install it with: "
            'pip install "paratrain[demo]" (from a clone: pip install -e ".[demo]", or make demo).'
        )


def _preflight(args: argparse.Namespace) -> tuple[int, int, str]:
    """Validate everything a rank would, before starting any rank: (ranks, GPUs, what runs)."""
    try:
        import torch

        from paratrain.commands.run.preflight import preflight
        from paratrain.config import RunConfig
        from paratrain.data.build import check_batch_size
    except ImportError as err:  # a broken torch install: a message, not a traceback
        raise EnvironmentMismatchError(
            f"`paratrain demo` cannot start: importing torch failed ({err}). Run "
            "`paratrain doctor` to see what is broken and how to fix it."
        ) from err
    config = RunConfig(strategy=args.strategy, precision=args.precision, grad_accum=args.grad_accum)
    check_batch_size(args.batch_size)  # flags are range-checked by cli_types
    gpus = torch.cuda.device_count()
    nproc: int = args.nproc if args.nproc is not None else (gpus or 2)
    selection = preflight(config, nproc=nproc, gpus=gpus)
    strategy, ranks = selection.strategy, f"{nproc} rank{'' if nproc == 1 else 's'}"
    what = f"{ranks} ({strategy.name} on {strategy.device.type}, {selection.backend})"
    return nproc, gpus, what


def _run_dir(args: argparse.Namespace) -> DemoFiles:
    run_dir: Path = args.run_dir or Path("runs/demo") / time.strftime("%Y%m%d-%H%M%S")
    check_creatable(run_dir, "--run-dir")  # a name the OS refuses is a message, not a traceback
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise ConfigError(
            f"--run-dir {run_dir} is not empty. Pass a new folder, or leave "
            "--run-dir out to get a fresh one under runs/demo/."
        )
    return DemoFiles(run_dir)


def _crash_epoch(args: argparse.Namespace) -> tuple[int, str]:
    """(the epoch a rank is killed in, or 0; why there is none)."""
    if args.skip_resume:
        return 0, "--skip-resume"
    if args.epochs < 2:
        return 0, "one epoch has no checkpoint before a crash in it; use --epochs 2 or more"
    return args.epochs // 2 + 1, ""


class _Clock:
    """Wall time of the demo's parts, in order."""

    def __init__(self) -> None:
        self.phases: list[Phase] = []
        self._last = time.perf_counter()

    def lap(self, what: str, note: str = "") -> float:
        """End the part called ``what``; its seconds."""
        now = time.perf_counter()
        self.phases.append(Phase(what, now - self._last, note))
        self._last = now
        return self.phases[-1].seconds


def run_demo(args: argparse.Namespace) -> int:
    """Train (crash once, resume), reload, compare, plot; the exit code of :func:`render`."""
    try:
        return _demo(args)
    except KeyboardInterrupt:  # torchrun and the ranks got the Ctrl-C too (one process group)
        say("interrupted")
        return 130


def _demo(args: argparse.Namespace) -> int:
    clock = _Clock()
    check_demo_extra()  # before any message that promises work
    say("checking the settings (this process imports torch first, ~2 s) ...")
    job = _prepare(args)
    clock.lap("checking the settings", "this process imports torch")
    crash_epoch, skipped = _crash_epoch(args)
    launched = time.time()
    _train(job, crash_epoch)
    records = read_records(job.files.metrics, job.files.restarts)
    parts = job_breakdown(records, launched=launched, ended=time.time())
    seconds = clock.lap("training job", "; ".join(f"{w} {s:.1f} s" for w, s in parts))
    say(f"training done: {records.train_seconds:.1f} s of the job's {seconds:.1f} s were training")
    say("reloading the saved weights in a fresh CPU process (it imports torch too) ...")
    reloaded = reload(job.files.weights)
    clock.lap("reload", "a fresh process imports torch and reads the weights")
    resume = _check_resume(job) if crash_epoch else None
    if resume is not None:
        clock.lap(
            "uninterrupted run", f"torchrun and its ranks start again, then {args.epochs} epochs"
        )
    say("plotting the curves ...")
    trained = json.loads(job.files.result.read_text())
    resumed_after = crash_epoch - 1 if resume is not None and resume.restarted else None
    curves = CurvesJob(trained["strategy"], trained["world_size"], TARGET_ACCURACY, resumed_after)
    plot_curves(records, job.files.curves, job=curves)
    clock.lap("plot")
    outcome = Outcome(
        files=job.files,
        trained=trained,
        reloaded=reloaded,
        epochs=args.epochs,
        train_seconds=records.train_seconds,
        resume=resume,
        resume_skipped=skipped,
        crash_epoch=crash_epoch,
        phases=clock.phases,
    )
    text, code = render(outcome, target=TARGET_ACCURACY, default_epochs=DEFAULT_EPOCHS)
    print(f"\n{text}", flush=True)
    return code


def _prepare(args: argparse.Namespace) -> TrainingJob:
    """Check the settings and the run dir (nothing is written before both pass); the job."""
    nproc, gpus, what = _preflight(args)
    files = _run_dir(args)
    options = JobOptions(
        epochs=args.epochs,
        batch_size=args.batch_size,
        strategy=args.strategy,
        precision=args.precision,
        grad_accum=args.grad_accum,
        progress=not args.no_progress,
    )
    job = TrainingJob(options, files, nproc=nproc, gpus=gpus)
    job.command()  # what the launcher refuses, before anything is written
    make_folder(files.root, "--run-dir")
    say(f"{what} through torchrun, writing to {files.root}")
    return job


def _train(job: TrainingJob, crash_epoch: int) -> None:
    """The training job, its ranks printing to this terminal; a failed job raises."""
    argv, env = job.command(crash_in_epoch=crash_epoch)
    if crash_epoch:
        say(
            f"rank {job.nproc - 1} will be killed in epoch {crash_epoch}, to show torchrun's "
            "restart resuming from the newest checkpoint (--skip-resume leaves this out)"
        )
    say("starting the ranks: each is a new Python process that imports torch, a few seconds ...")
    code = subprocess.run(argv, env=env).returncode
    if code != 0:
        raise job_failed(code, "The demo's training ranks failed; their messages are above")


def _check_resume(job: TrainingJob) -> ResumeCheck:
    """Train once more without the crash, in the reference folder, and compare."""
    quiet = replace(job.options, progress=False)  # its output goes to a file
    reference = replace(job, files=job.files.reference, options=quiet)
    say(f"checking the resume: the same training again, uninterrupted, in {reference.files.root}")
    print("  epochs done:", end="", flush=True)
    try:
        reference.run_quietly(say=lambda epoch: print(f" {epoch}", end="", flush=True))
    finally:
        print(flush=True)
    return check_resume(job.files, reference.files)
