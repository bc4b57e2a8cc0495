"""What verify-resume was asked, and what it found: one outcome per killed run.

options = Options(target=["train.py"], nproc=2, kills=4)
report = Report(options=options)           # filled in by paratrain.commands.verify.runner.verify
report.exit_code(), report.to_json()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paratrain.commands.verify.compare import Difference
from paratrain.commands.verify.kill_points import Choice
from paratrain.commands.verify.runs import RunResult


@dataclass(kw_only=True)
class Options:
    """What ``paratrain verify-resume`` was asked to do."""

    target: list[str]
    """``[script.py, args...]`` or ``[-m, module, args...]``."""

    @property
    def script(self) -> str:
        """The script (or ``-m module``) as the user named it."""
        return " ".join(self.target[:2]) if self.target[0] == "-m" else self.target[0]

    nproc: int = 1
    """Ranks of every run."""
    kills: int = 4
    """Killed runs (fewer when the script has fewer kill points)."""
    seed: int = 0
    """0: ordinals spread from the middle of the run; else drawn at random with this seed."""
    run_dir: Path = Path("runs/verify-resume")
    """The folder that holds every run's run dir."""
    compare_files: str | None = None
    """A glob of files under each run dir to compare too (``best.pt``)."""
    atol: float = 0.0
    """Allowed max |Δ| of floats (0: bit for bit)."""
    exclude: tuple[str, ...] = ()
    """Globs of state paths left out of every comparison (a time stamp kept in the extras)."""


@dataclass(kw_only=True)
class Outcome:
    """One killed run."""

    choice: Choice
    step: int
    epoch: int
    """Where the killed rank was when it died (the uninterrupted run's, if it never got there)."""
    run_dir: Path
    result: str
    """``match``, ``DIFFERS``, ``did not finish`` or ``kill point not reached``."""
    resumed_from: int | str | None
    """The step of the checkpoint the restarted ranks resumed from, ``fresh``, or None."""
    difference: Difference | None
    seconds: float
    tail: str | None = None
    """The end of the run's output when it did not finish."""

    def to_json(self) -> dict[str, Any]:
        """The outcome as JSON data."""
        d = self.difference
        return {
            "kill_point": str(self.choice.point),
            "event": self.choice.point.event,
            "n": self.choice.point.n,
            "rank": self.choice.point.rank,
            "step": self.step,
            "epoch": self.epoch,
            "resumed_from": self.resumed_from,
            "result": self.result,
            "first_difference": None
            if d is None
            else {"path": d.path, "detail": d.detail, "max_abs": d.max_abs},
            "time_s": round(self.seconds, 2),
            "run_dir": str(self.run_dir),
            "output_tail": self.tail,
        }


@dataclass(kw_only=True)
class Report:
    """Everything verify-resume found."""

    options: Options
    straight_s: list[float] = field(default_factory=list)
    """Times of the uninterrupted runs."""
    failed: RunResult | None = None
    """An uninterrupted run that did not finish (the script fails on its own)."""
    nondeterminism: Difference | None = None
    """The first difference between the two uninterrupted runs."""
    kills: list[Outcome] = field(default_factory=list)
    total_s: float = 0.0

    def exit_code(self) -> int:
        """0 when every killed run matches; 1 otherwise."""
        if self.failed is not None or self.nondeterminism is not None:
            return 1
        return 0 if all(k.result == "match" for k in self.kills) else 1

    def to_json(self) -> dict[str, Any]:
        """The report as JSON data."""
        straight = self.straight_s[0] if self.straight_s else None
        n = self.nondeterminism
        return {
            "script": self.options.target,
            "nproc": self.options.nproc,
            "run_dir": str(self.options.run_dir),
            "atol": self.options.atol,
            "straight_run_s": None if straight is None else round(straight, 2),
            "total_s": round(self.total_s, 2),
            "cost_in_runs": round(self.total_s / straight, 1) if straight else None,
            "straight_run_failed": None
            if self.failed is None
            else {
                "code": self.failed.code,
                "failure": self.failed.failure(),
                "output_tail": self.failed.tail(),
            },
            "deterministic": None if self.failed else n is None,
            "nondeterminism": None if n is None else {"path": n.path, "detail": n.detail},
            "runs": [k.to_json() for k in self.kills],
            "exit_code": self.exit_code(),
        }
