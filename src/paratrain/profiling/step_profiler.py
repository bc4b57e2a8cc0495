"""Profile a window of training steps on every rank: a trace per rank and where the time went.

    with pt.Run(profile=True) as run:                   # records steps 7-9 (wait 5, warm up 1)
    with pt.Run(profile=pt.Profile(wait=20, active=5, record_shapes=True)) as run:
    run.profile(active=3)                               # or arm a window now, from the next step

Steps are optimizer steps (``run.step``), counted from the first training action. At the end of
the window every rank writes ``run_dir/profile/rank<r>.steps-<a>-<b>.pt.trace.json`` (Chrome
trace format: open it in https://ui.perfetto.dev or chrome://tracing, or point TensorBoard with
the torch-tb-profiler plugin at ``run_dir/profile``) and ``rank<r>.steps-<a>-<b>.summary.json``,
and the main process prints one table: each rank's step time split into compute,
communication, data wait, optimizer and idle (see :mod:`paratrain.profiling.summary`). The end of
the window is collective (the table gathers every rank's summary): every rank profiles.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from paratrain.distributed import collectives
from paratrain.errors import ConfigError
from paratrain.profiling.summary import Summary, render, summarize


class Says(Protocol):
    """Where the profiler prints: the run's console (the main process prints)."""

    def print(self, *values: object, sep: str = " ", end: str = "\n", file: Any = None) -> None:
        """``print`` on the main process."""

    def warn(self, message: str) -> None:
        """A one-line warning."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    """Which steps to profile, and what to record. ``Run(profile=True)`` takes the defaults."""

    wait: int = 5
    """Steps to let pass first (start-up, first-step compilation, allocator warm-up)."""
    warmup: int = 1
    """Steps traced and thrown away (the profiler's own start-up cost lands here)."""
    active: int = 3
    """Steps recorded into the trace and the summary."""
    record_shapes: bool = False
    """Record input shapes of every op (larger traces)."""
    profile_memory: bool = False
    """Record tensor allocations and frees."""
    with_stack: bool = False
    """Record the Python stack of every op (much larger traces, slower)."""

    def __post_init__(self) -> None:
        for name, low in (("wait", 0), ("warmup", 0), ("active", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 10**6:
                raise ConfigError(
                    f"profile {name} must be an integer from {low} to 1000000 (steps), got "
                    f"{value!r}. E.g. pt.Profile(wait=5, warmup=1, active=3)."
                )
        for name in ("record_shapes", "profile_memory", "with_stack"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"profile {name} must be True or False, got {getattr(self, name)!r}."
                )


ProfileSetting = Profile | bool | dict[str, Any] | None
"""What ``Run(profile=...)`` takes: True (default window), a :class:`Profile`, a dict of its
fields, or None/False (no profiling)."""


def as_profile(value: object, name: str = "profile") -> Profile | None:
    """The window that ``value`` asks for; :class:`ConfigError` naming the fix otherwise."""
    if value is None or value is False:
        return None
    if value is True:
        return Profile()
    if isinstance(value, Profile):
        return value
    if isinstance(value, dict):
        known = [f.name for f in dataclasses.fields(Profile)]
        unknown = [k for k in value if k not in known]
        if unknown:
            raise ConfigError(
                f"{name} has unknown field(s) {', '.join(map(repr, unknown))}; a profile "
                f"window takes {', '.join(known)}. E.g. {name}={{'wait': 5, 'active': 3}}."
            )
        return Profile(**value)
    raise ConfigError(
        f"{name} must be True, a pt.Profile(wait=, warmup=, active=) or a dict of those, got "
        f"{value!r}. E.g. pt.Run(profile=True) records steps 7-9."
    )


def check_profile_setting(name: str, value: object) -> None:
    """The config rule of ``profile``."""
    as_profile(value, name)


class StepProfiler:
    """One window of ``torch.profiler`` over optimizer steps, started at the first loop action.
    When it ends, every rank's summary is gathered and the main process prints the table."""

    def __init__(
        self,
        window: Profile,
        *,
        directory: Path,
        rank: int,
        device: torch.device,
        console: Says,
    ) -> None:
        self.window = window
        self.directory = directory
        self.rank = rank
        self.device = device
        self.console = console
        self.steps = 0
        """Steps counted since the window started."""
        self.first_step: int | None = None
        """The global step the window's first step will have (set at start)."""
        self.done = False
        self.written: list[Path] = []
        self._profiler: profile | None = None

    @property
    def running(self) -> bool:
        return self._profiler is not None

    def start(self, global_step: int) -> None:
        """Begin counting steps (the next completed step is step ``global_step + 1``)."""
        if self._profiler is not None or self.done:
            return
        if torch.autograd.profiler._is_profiler_enabled:
            self.done = True
            self.console.warn(
                "a torch.profiler session of your own is running; paratrain's profile window "
                "would end it, so it is skipped. Use one or the other."
            )
            return
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        w = self.window
        self.first_step = global_step + 1
        self._profiler = profile(
            activities=activities,
            schedule=schedule(wait=w.wait, warmup=w.warmup, active=w.active, repeat=1),
            on_trace_ready=self._ready,
            record_shapes=w.record_shapes,
            profile_memory=w.profile_memory,
            with_stack=w.with_stack,
        )
        with warnings.catch_warnings():  # warmup=0 was asked for; torch warns about it
            warnings.filterwarnings("ignore", message=".*warmup.*")
            self._profiler.start()

    def step(self) -> None:
        """An optimizer step ended (every rank, the same step)."""
        if self._profiler is not None:
            self.steps += 1
            self._profiler.step()
            if self.done:  # the window ended inside that call: release torch's step marker
                self._profiler.stop()
                self._profiler = None

    def _ready(self, prof: profile) -> None:
        assert self.first_step is not None
        w = self.window
        first = self.first_step + w.wait + w.warmup
        last = first + w.active - 1
        self.directory.mkdir(parents=True, exist_ok=True)
        stem = self.directory / f"rank{self.rank}.steps-{first}-{last}"
        trace = stem.with_name(stem.name + ".pt.trace.json")
        prof.export_chrome_trace(str(trace))
        summary = summarize(json.loads(trace.read_text()), rank=self.rank)
        summary = dataclasses.replace(summary, first_step=first, last_step=last)
        summary_file = stem.with_name(stem.name + ".summary.json")
        summary_file.write_text(json.dumps(summary.as_dict(), indent=1) + "\n")
        self.written += [trace, summary_file]
        self.done = True
        print_table(collectives.gather(summary), self.console.print)  # every rank's, collective

    def close(self) -> str | None:
        """Stop a window the run did not finish; the reason, for a warning (None if none)."""
        prof, self._profiler = self._profiler, None
        if prof is None:
            return None
        prof.on_trace_ready = None
        prof.stop()
        if self.done:
            return None
        w = self.window
        first = (self.first_step or 0) + w.wait + w.warmup
        needed = w.wait + w.warmup + w.active
        fits = (
            f"e.g. wait=0, warmup=1, active={self.steps - 1}" if self.steps >= 2 else "a longer run"
        )
        return (
            f"the profile window (recording steps {first}-{first + w.active - 1}) did not "
            f"finish: the run stopped {self.steps} step(s) into the {needed} it needs, so no "
            f"trace was written. Ask for a window that fits ({fits})."
        )


def check_no_window(current: StepProfiler | None, *, closed: bool) -> None:
    """Refuse a second window while one is armed or running, or after the run closed."""
    if closed:
        raise ConfigError("run.profile: the run is closed. Profile steps before run.close().")
    if current is not None and not current.done:
        raise ConfigError(
            "run.profile: a profile window is already armed (Run(profile=...) or an earlier "
            "run.profile). Call run.profile again after its table was printed."
        )


def print_table(summaries: Sequence[Summary], say: Callable[[str], None]) -> None:
    """Print every rank's summary (the main process's console)."""
    say(render(sorted(summaries, key=lambda s: s.rank)))
