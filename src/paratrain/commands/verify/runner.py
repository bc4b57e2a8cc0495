"""The verification: two uninterrupted runs, then one run per kill point, each compared.

    report = verify(Options(target=["train.py", "--lr", "3e-4"], nproc=2, kills=4), say=print)
    report.exit_code()        # 0: every killed run ended as the uninterrupted one
    report.kills[0].result    # "match", "DIFFERS", "did not finish", "kill point not reached"

Run folders under ``run_dir``: ``straight-1``, ``straight-2``, ``kill-<i>-<event>``, each made
afresh. A script that keeps its checkpoints outside the run dir it is given (its own
``ckpt_dir=`` or ``run_dir=``) would let the runs resume from each other's checkpoints: that is
refused (a ConfigError, exit code 2), as is a script that never creates ``pt.Run``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paratrain.checkpoint.object_storage import is_url
from paratrain.commands.verify.compare import Difference, compare
from paratrain.commands.verify.kill_points import SOURCE, Choice, choose, read_trace
from paratrain.commands.verify.report import Options, Outcome, Report
from paratrain.commands.verify.runs import RunFiles, RunResult, launch, plan_for, reported_dirs
from paratrain.commands.verify.states import MISSING, run_state
from paratrain.core.paths import check_creatable
from paratrain.core.run_dir import RunDir
from paratrain.errors import ConfigError

RUN_DIR_CONFLICT = "but the launcher set --run-dir"
"""In the error a script's Run raises when it passes a run_dir= of its own."""


def verify(options: Options, *, say: Callable[[str], None]) -> Report:
    """Run the verification; a usage error is a ConfigError raised before or after the first
    run (never after a kill)."""
    started = time.perf_counter()
    root = options.run_dir
    check_creatable(root, "--run-dir")
    plan_for(options.target, nproc=options.nproc, run_dir=root / "straight-1", max_restarts=0)
    report = Report(options=options)
    first = _straight(options, 1, report, say)
    if first is None:
        return _done(report, started)
    _check_dirs(first, options)
    choices = _kill_points(first, options, say)
    reference = run_state(first, world_size=options.nproc, compare_files=options.compare_files)
    _check_reference(reference, options)
    second = _straight(options, 2, report, say)
    if second is None:
        return _done(report, started)
    repeat = run_state(second, world_size=options.nproc, compare_files=options.compare_files)
    names = ("first uninterrupted run", "second uninterrupted run")
    differences = compare(reference, repeat, atol=options.atol, names=names, ignore=options.exclude)
    if differences:
        report.nondeterminism = differences[0]
        say(f"verify-resume: the two uninterrupted runs differ: {differences[0]}")
        return _done(report, started)
    limit = 60.0 + 4 * max(report.straight_s)
    for i, choice in enumerate(choices, 1):
        outcome = _killed(options, i, choice, reference, limit)
        report.kills.append(outcome)
        say(
            f"verify-resume: kill {i} of {len(choices)}, {choice.describe()} on rank "
            f"{choice.point.rank}: {outcome.result} ({outcome.seconds:.1f} s)"
        )
    return _done(report, started)


def _kill_points(first: RunResult, options: Options, say: Callable[[str], None]) -> list[Choice]:
    choices = choose(
        read_trace(first.files.trace),
        kills=options.kills,
        world_size=options.nproc,
        seed=options.seed,
    )
    if not choices:
        raise ConfigError(
            f"{options.script} created paratrain.Run but never reached a kill point (no "
            "run.step, run.save, run.epochs, eval_loader batch or accumulation window), so "
            "there is nothing to interrupt. verify-resume checks scripts that train with "
            "pt.Run's loop; see docs/concepts/verify-resume.md."
        )
    if len(choices) < options.kills:
        say(f"verify-resume: the run has only {len(choices)} kill points; all of them are used")
    return choices


def _done(report: Report, started: float) -> Report:
    report.total_s = time.perf_counter() - started
    return report


def _straight(
    options: Options, i: int, report: Report, say: Callable[[str], None]
) -> RunResult | None:
    """Uninterrupted run ``i``; None (and ``report.failed``) when it did not finish."""
    files = RunFiles(options.run_dir / f"straight-{i}")
    say(f"verify-resume: uninterrupted run {i} of 2 in {files.run_dir} ...")
    result = launch(options.target, nproc=options.nproc, files=files)
    if result.code != 0 and RUN_DIR_CONFLICT in result.output():
        raise ConfigError(_shared_dirs(options, "its own run_dir="))
    if result.code != 0:
        report.failed = result
        return None
    report.straight_s.append(result.seconds)
    say(f"verify-resume: uninterrupted run {i} of 2 finished in {result.seconds:.1f} s")
    return result


def _check_dirs(result: RunResult, options: Options) -> None:
    """Refuse a script that never made pt.Run, or keeps checkpoints outside its run dir."""
    if result.report is None:
        raise ConfigError(
            f"{options.script} ran to its end without creating paratrain.Run, so there are "
            "no checkpoints, kill points or final states to compare. verify-resume checks "
            "scripts that train with pt.Run (run.setup, run.step, run.save); see "
            "docs/concepts/verify-resume.md."
        )
    _, ckpt_dir = reported_dirs(result.report)
    own = result.files.run_dir.resolve()
    if ckpt_dir is None or is_url(ckpt_dir) or not Path(ckpt_dir).resolve().is_relative_to(own):
        raise ConfigError(_shared_dirs(options, f"ckpt_dir={ckpt_dir!r}"))


def _check_reference(state: dict[str, Any], options: Options) -> None:
    """Refuse a comparison that would pass for want of anything to compare."""
    missing = [key for key, value in state.items() if value == MISSING]
    if missing:
        raise ConfigError(
            f"{options.script} ended without {missing[0]} writing its final state (it is "
            "written when the run closes, or at a normal interpreter exit; os._exit, or a "
            "signal, skips it), so there is nothing to compare. End the script normally, or "
            "close the run (`with pt.Run(...) as run:` or run.close())."
        )
    if options.compare_files and not state.get("files"):
        raise ConfigError(
            f"--compare-files {options.compare_files!r} matched no file in "
            f"{options.run_dir / 'straight-1'}. Give a pattern relative to the run dir, for a "
            "file the script writes there (e.g. best.pt, 'exports/*.pt')."
        )


def _shared_dirs(options: Options, what: str) -> str:
    return (
        f"{options.script} sets {what}, outside the run dir paratrain gives each run, so the "
        "runs verify-resume makes would share checkpoints (a killed run could resume from "
        "another run's). Let the run dir decide: drop run_dir= and ckpt_dir= from pt.Run (the "
        "default ckpt_dir is run_dir/checkpoints), or build them from run.run_dir; `paratrain "
        "run --run-dir DIR` then moves everything."
    )


def _killed(
    options: Options, i: int, choice: Choice, reference: dict[str, Any], limit: float
) -> Outcome:
    files = RunFiles(options.run_dir / f"kill-{i}-{choice.point.event}")
    result = launch(
        options.target, nproc=options.nproc, files=files, kill=choice.point, timeout_s=limit
    )
    point = choice.point
    event = SOURCE.get(point.event, point.event)  # a preemption is sent at a step
    reached = next(
        (
            e
            for e in read_trace(files.trace)
            if (e.event, e.n, e.rank, e.restart) == (event, point.n, point.rank, 0)
        ),
        None,
    )
    outcome = Outcome(
        choice=choice,
        step=choice.step if reached is None else reached.step,
        epoch=choice.epoch if reached is None else reached.epoch,
        run_dir=files.run_dir,
        result="match",
        resumed_from=_resumed_from(files),
        difference=None,
        seconds=result.seconds,
    )
    if result.code != 0:
        outcome.result = "did not finish"
        outcome.tail = f"({result.failure()})\n{result.tail()}"
        return outcome
    if reached is None:
        outcome.result = "kill point not reached"
        return outcome
    state = run_state(result, world_size=options.nproc, compare_files=options.compare_files)
    lost = next((key for key, value in state.items() if value == MISSING), None)
    if lost is not None:
        outcome.result = "DIFFERS"
        outcome.difference = Difference(lost, "no final state written after the restart")
        return outcome
    names = ("uninterrupted run", "killed run")
    differences = compare(reference, state, atol=options.atol, names=names, ignore=options.exclude)
    if differences:
        outcome.result, outcome.difference = "DIFFERS", differences[0]
    return outcome


def _resumed_from(files: RunFiles) -> int | str | None:
    """The step the restarted run resumed from (``fresh``: no checkpoint), from the first line
    of the run dir's ``restarts.jsonl``; None when the restarted run never resumed."""
    try:
        line = RunDir(files.run_dir).restarts.read_text().splitlines()[0]
        record = json.loads(line)
    except (OSError, IndexError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    return int(record.get("step", 0)) if record.get("resumed") else "fresh"
