"""The summary ``paratrain demo`` prints at its end, and its exit code.

    text, code = render(outcome, target=0.95, default_epochs=12)

The exit code is 0 when the test accuracy reaches the target, and also when it does not because
fewer epochs than the default were asked for (that is said plainly, with the fix); 1 when the
default training misses the target or the resumed run differs from the uninterrupted one.
Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from paratrain.commands.demo.artefacts import KEEP_CHECKPOINTS, DemoFiles
from paratrain.commands.demo.resume_check import ResumeCheck

INDENT = " " * 15


@dataclass(frozen=True, slots=True)
class Phase:
    """One part of the demo's wall time."""

    what: str
    seconds: float
    note: str = ""
    """What the time went to, when the name does not say it."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the demo measured."""

    files: DemoFiles
    trained: dict[str, Any]
    """``train_result.json``: accuracy, steps, strategy, world size, device."""
    reloaded: dict[str, float]
    """The fresh process's accuracy of the saved weights."""
    epochs: int
    """The epochs asked for."""
    train_seconds: float
    """The epochs' training passes, timed inside the ranks (every attempt)."""
    resume: ResumeCheck | None = None
    """The comparison with an uninterrupted run (None: not shown)."""
    resume_skipped: str = ""
    """Why the resume was not shown (when ``resume`` is None)."""
    crash_epoch: int = 0
    """The epoch a rank was killed in (0: none)."""
    phases: list[Phase] = field(default_factory=list)
    """Wall time of each part of the demo, in order."""


def render(outcome: Outcome, *, target: float, default_epochs: int) -> tuple[str, int]:
    """The summary's lines and the exit code."""
    t = outcome.trained
    attempts = ", both attempts" if outcome.resume and outcome.resume.restarted else ""
    result, code = _verdict(outcome, target=target, default_epochs=default_epochs)
    lines = [
        f"  trained      {t['strategy']} x {_count(t['world_size'], 'rank')} ({t['device']}): "
        f"{t['steps']} steps in {outcome.train_seconds:.1f} s (the training passes, timed "
        f"inside the ranks{attempts})",
        f"  test accuracy, distributed eval ({t['test_samples']} samples once): "
        f"{t['test_accuracy']:.4f}",
        f"  test accuracy, reloaded in a fresh CPU process:        "
        f"{outcome.reloaded['test_accuracy']:.4f}",
        *_resume_lines(outcome, int(t["world_size"])),
        f"  weights      {outcome.files.weights}",
        f"  checkpoints  {outcome.files.checkpoints} (one per epoch, the newest "
        f"{KEEP_CHECKPOINTS} kept)",
        f"  curves       {outcome.files.curves}",
        f"  tensorboard  tensorboard --logdir {outcome.files.layout.tensorboard}",
        *_time_lines(outcome),
        f"  result       {result}",
    ]
    return "\n".join(lines), code


def _verdict(outcome: Outcome, *, target: float, default_epochs: int) -> tuple[str, int]:
    accuracy = min(outcome.trained["test_accuracy"], outcome.reloaded["test_accuracy"])
    if outcome.resume is not None and not outcome.resume.matches:
        return "DIFFERS: the resumed run did not end as the uninterrupted one (see resume)", 1
    if accuracy >= target:
        return f"OK: test accuracy {accuracy:.4f} reaches the target {target}", 0
    if outcome.epochs < default_epochs:
        were = "was" if outcome.epochs == 1 else "were"
        return (
            f"{_count(outcome.epochs, 'epoch')} {were} too few to reach the target {target} "
            f"(test accuracy {accuracy:.4f}).\n{INDENT}The default, "
            f"{default_epochs} epochs, reaches it: run `paratrain demo` without --epochs."
        ), 0
    return (
        f"BELOW: test accuracy {accuracy:.4f} after {outcome.epochs} epochs is under the "
        f"target {target}, which the default settings reach; compare your flags with "
        "`paratrain demo --help`"
    ), 1


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _resume_lines(outcome: Outcome, world_size: int) -> list[str]:
    check = outcome.resume
    if check is None:
        return [f"  resume       not shown ({outcome.resume_skipped})"]
    if not check.restarted:
        return ["  resume       DIFFERS: no restart happened, the crash did not take place"]
    reference = outcome.files.reference.root
    twice = f"the {_count(check.redone, 'step')} run twice gave"
    if not check.redone:
        redone = "no step ran twice: the crash came right after a checkpoint"
    elif check.redone_equal:
        redone = f"{twice} the same losses both times, bit for bit"
    else:
        redone = f"{twice} DIFFERENT losses the second time"
    if check.first_difference is None and check.weights_equal:
        against = (
            f"all {check.steps} step losses and the final weights equal those of an "
            f"uninterrupted run ({reference}), bit for bit"
        )
    else:
        at = check.first_difference
        losses = f"losses differ from step {at}" if at is not None else "losses equal"
        weights = (
            "final weights equal"
            if check.weights_equal
            else f"final weights differ by up to {check.weights_max_diff:.3g}"
        )
        against = f"against an uninterrupted run ({reference}): {losses}, {weights}"
    return [
        f"  resume       rank {world_size - 1} killed in epoch {outcome.crash_epoch} after "
        f"step {check.crashed_after}; torchrun restarted the ranks, which resumed from the "
        f"checkpoint of step {check.resumed_at}",
        f"{INDENT}{redone}",
        f"{INDENT}{against}",
    ]


def _time_lines(outcome: Outcome) -> list[str]:
    total = sum(phase.seconds for phase in outcome.phases)
    lines = [
        f"  time         {total:.1f} s in all, {outcome.train_seconds:.1f} s of it training; "
        "the rest is mostly new processes starting, each importing torch:"
    ]
    for phase in outcome.phases:
        note = f" ({phase.note})" if phase.note else ""
        lines.append(f"{INDENT}  {phase.what} {phase.seconds:.1f} s{note}")
    return lines
