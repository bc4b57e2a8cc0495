"""Diagnose hangs: when a rank makes no progress, dump where every thread is, then exit.

    dog = Watchdog(RunDir(run_dir).stacks, rank=1, after_s=480, exit_after_dump=True)
    dog.progress(step=120)      # from Run.step / backward / barrier
    ...
    dog.stop()

Each rank's watchdog fires on its own, writes ``stacks/rank<r>.txt`` (all Python stacks, via
faulthandler) and ``stacks/rank<r>.json`` (step, seconds idle, and a verdict on its main thread's
stack), and ends the process so that no rank hangs forever. The verdict names the innermost
frame of the *user's* code (not torch, paratrain, the standard library or site-packages) and
whether the rank was waiting for the others: its innermost frame is in torch, or it is inside a
paratrain call that is a collective (``run.save``, ``run.barrier``, ...). :func:`diagnose` reads
the records and names the stalled rank(s), the ones not waiting; when every rank waits, the ones
at the lowest step, each with the call it waits in::

    rank 1 at step 5: train.py:20 (in <module>)
    rank 0 at step 5: train.py:31 (in run.save, waiting for the other ranks)
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.util
import json
import os
import site
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal

STALLED_EXIT = 124
"""The exit code of a rank the watchdog ended (as ``timeout``'s): it made no progress within
0.9 x ``timeout_s``. Distinct from 75, a preempted rank that saved."""

Kind = Literal["user", "torch", "paratrain", "library"]

COLLECTIVE_CALLS = frozenset(
    {
        "__init__",
        "epochs",
        "setup",
        "backward",
        "step",
        "reduce",
        "gather",
        "barrier",
        "save",
        "save_weights",
        "resume",
        "close",
        "__exit__",
    }
)
"""Methods of :class:`paratrain.Run` that every rank must call together."""


def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    locations = spec.submodule_search_locations if spec is not None else None
    return os.path.realpath(next(iter(locations))) if locations else None


@dataclass(frozen=True, slots=True)
class CodeRoots:
    """Where torch, paratrain and third-party/standard-library code live."""

    torch: str | None
    paratrain: str
    libraries: tuple[str, ...]
    """Standard library and site-packages directories."""

    @classmethod
    def here(cls) -> CodeRoots:
        """The roots of this interpreter."""
        paths = sysconfig.get_paths()
        libraries = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        libraries.update([*site.getsitepackages(), site.getusersitepackages()])
        return cls(
            torch=_package_dir("torch"),
            paratrain=os.path.dirname(os.path.dirname(os.path.realpath(__file__))),  # src/paratrain
            libraries=tuple(sorted(os.path.realpath(p) for p in libraries)),
        )

    def kind(self, filename: str) -> Kind:
        """Whose code ``filename`` is."""
        if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
            return "library"
        path = os.path.realpath(filename)
        if self.torch is not None and _under(path, self.torch):
            return "torch"
        if _under(path, self.paratrain):
            return "paratrain"
        parts = path.split(os.sep)
        if "site-packages" in parts or "dist-packages" in parts:
            return "library"
        if any(_under(path, root) for root in self.libraries):
            return "library"
        return "user"


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Where a rank's main thread is, judged for a hang report."""

    where: str
    """``file:line in function`` of the innermost user frame (the innermost frame if none)."""
    short: str
    """``train.py:20``: the same frame, file name only."""
    call: str | None
    """What the user's line called, e.g. ``run.save`` or ``torch.distributed.all_reduce``."""
    waiting_in_torch: bool
    """The innermost frame is in torch (paratrain frames do not count)."""
    waiting: bool
    """Waiting for the other ranks: in torch, or inside a collective paratrain call."""


def judge(stack: Sequence[traceback.FrameSummary], roots: CodeRoots | None = None) -> Verdict:
    """The verdict on a stack (outermost frame first, as ``traceback.extract_stack`` gives)."""
    roots = roots or CodeRoots.here()
    if not stack:
        return Verdict("?", "?", None, False, False)
    kinds = [roots.kind(f.filename) for f in stack]
    users = [i for i, k in enumerate(kinds) if k == "user"]
    at = users[-1] if users else len(stack) - 1
    frame = stack[at]
    callee = stack[at + 1] if at + 1 < len(stack) else None
    call = _call_name(stack[at + 1 :], kinds[at + 1 :], roots) if callee is not None else None
    in_torch = kinds[-1] == "torch"
    own = [k for k in kinds if k in ("user", "paratrain")]
    in_collective = (
        bool(own)
        and own[-1] == "paratrain"
        and callee is not None
        and kinds[at + 1] == "paratrain"
        and callee.name in COLLECTIVE_CALLS
    )
    return Verdict(
        where=f"{frame.filename}:{frame.lineno} in {frame.name}",
        short=f"{os.path.basename(frame.filename)}:{frame.lineno}",
        call=call,
        waiting_in_torch=in_torch,
        waiting=in_torch or in_collective,
    )


_WRAPPERS = frozenset({"wrapper", "inner", "_fn", "fn", "decorate_context", "__call__"})
"""Names of decorator layers, skipped when naming a torch call (``dist.all_reduce`` is one)."""


def _call_name(
    frames: Sequence[traceback.FrameSummary], kinds: list[Kind], roots: CodeRoots
) -> str:
    """``run.save`` for a Run method, else ``package.module.function`` of the called code."""
    if frames and frames[0].filename.endswith("collective_log.py") and len(frames) > 1:
        frames, kinds = frames[1:], kinds[1:]  # the collective log's wrapper: name torch's call
    frame, kind = frames[0], kinds[0]
    path = os.path.realpath(frame.filename)
    if kind == "paratrain" and os.path.basename(path) == "run.py":
        return "paratrain.Run()" if frame.name == "__init__" else f"run.{frame.name}"
    if kind == "torch":
        pairs = zip(frames, kinds, strict=True)
        frame = next((f for f, k in pairs if k == "torch" and f.name not in _WRAPPERS), frame)
        path = os.path.realpath(frame.filename)
    root = {"torch": roots.torch, "paratrain": roots.paratrain}.get(kind)
    base = os.path.dirname(root) if root else _library_root(path, roots)
    if base is None or frame.filename.startswith("<"):
        return frame.name
    module = os.path.relpath(os.path.splitext(path)[0], base).replace(os.sep, ".")
    return f"{module.removesuffix('.__init__')}.{frame.name}"


def _library_root(path: str, roots: CodeRoots) -> str | None:
    inside = [r for r in roots.libraries if _under(path, r)]
    return max(inside, key=len) if inside else None


class Watchdog:
    """A daemon thread that fires once ``after_s`` seconds pass without progress."""

    def __init__(
        self,
        directory: Path,
        *,
        rank: int,
        after_s: float,
        exit_after_dump: bool = True,
        monitor: Any = None,
    ) -> None:
        self.directory, self.rank, self.after_s = directory, rank, after_s
        self.exit_after_dump = exit_after_dump
        self.monitor = monitor
        self._roots: CodeRoots | None = None
        """A :class:`paratrain.distributed.stall.StallMonitor`: names a hang long before
        ``after_s`` by comparing every rank's collectives; None: only the stacks at ``after_s``."""
        self.step = 0
        self._last = time.monotonic()
        self._started = time.time()
        self._main = threading.main_thread()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="paratrain-watchdog", daemon=True)
        self._thread.start()

    def progress(self, step: int) -> None:
        """Note that the training loop moved (cheap: two assignments)."""
        self.step = step
        self._last = time.monotonic()
        if self.monitor is not None:
            self.monitor.note_step(step)

    def stop(self) -> None:
        """End the watch (the run closed normally)."""
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.after_s / 4)):
            idle = time.monotonic() - self._last
            if idle >= self.after_s:
                self.dump(idle)
                if self.exit_after_dump:
                    os._exit(STALLED_EXIT)
                return
            if self.monitor is not None and self._named_a_stall(idle):
                if self.exit_after_dump:
                    os._exit(STALLED_EXIT)
                return

    def _named_a_stall(self, idle: float) -> bool:
        """:meth:`_stalled`, whose failure must not end the watch (the hard limit stays)."""
        try:
            return self._stalled(idle)
        except Exception as error:
            print(f"paratrain: rank {self.rank}: stall check failed: {error!r}", file=sys.stderr)
            self.monitor = None
            return False

    def _stalled(self, idle: float) -> bool:
        """Publish this rank's state; past the stall threshold, name the cause (and dump)."""
        if not self.monitor.due(idle):  # the stack is read only when it is published or judged
            return False
        frames = sys._current_frames().get(self._main.ident or -1)
        stack = traceback.extract_stack(frames) if frames is not None else []
        self._roots = self._roots or CodeRoots.here()
        verdict = judge(stack, self._roots)
        self.monitor.publish(self.step, stack, verdict)
        cause = self.monitor.check(idle, waiting=verdict.waiting)
        if cause is None:
            return False
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):  # the diagnosis stands without the trace
            from paratrain.distributed.process_group import dump_flight_recorder

            trace = dump_flight_recorder(self.directory, self.rank)
            if trace is not None:
                cause["nccl_trace"] = str(trace)
        (self.directory / "diagnosis.json").write_text(json.dumps(cause))
        print(
            f"paratrain: rank {self.rank}: hang after {idle:.0f}s without progress: "
            f"{cause['kind']}: {cause['summary']}",
            file=sys.stderr,
            flush=True,
        )
        self.dump(idle)
        return True

    def end_if_hang_named(self, frame: FrameType | None = None) -> None:
        """At a termination signal: when a peer named a hang in this job (its
        ``diagnosis.json``, written since this watch began), the signal is the launcher ending the
        job for it, not a preemption: write this rank's stacks (the stuck rank's own place is half
        the diagnosis) and exit with :data:`STALLED_EXIT` at once, instead of waiting for a safe
        point a stuck rank never reaches. Otherwise return (a preemption). ``frame``: where the
        signal found the main thread (the signal handler's own frames left out)."""
        named = self.directory / "diagnosis.json"
        try:
            fresh = named.stat().st_mtime >= self._started
        except OSError:
            return
        if not fresh:  # a previous job's report in the same run dir
            return
        self.dump(time.monotonic() - self._last, frame)
        os._exit(STALLED_EXIT)

    def dump(self, idle: float, frame: FrameType | None = None) -> Path:
        """Write this rank's stacks and a one-line verdict (of the main thread's stack, or of
        ``frame``'s); return the JSON path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        frames = frame or sys._current_frames().get(self._main.ident or -1)
        verdict = judge(traceback.extract_stack(frames) if frames is not None else [])
        with (self.directory / f"rank{self.rank}.txt").open("w") as f:
            f.write(f"rank {self.rank}: no progress for {idle:.0f}s after step {self.step}\n")
            faulthandler.dump_traceback(file=f, all_threads=True)
        record = {
            "rank": self.rank,
            "step": self.step,
            "idle_s": round(idle, 1),
            "waiting_in_torch": verdict.waiting_in_torch,
            "waiting": verdict.waiting,
            "call": verdict.call,
            "time": time.time(),
            "where": verdict.where,
            "short": verdict.short,
        }
        path = self.directory / f"rank{self.rank}.json"
        path.write_text(json.dumps(record))
        print(
            f"paratrain: rank {self.rank} made no progress for {idle:.0f}s after step "
            f"{self.step}: {describe(record)}; stacks in {self.directory}",
            file=sys.stderr,
            flush=True,
        )
        return path


def describe(record: dict[str, Any]) -> str:
    """``train.py:20 (in run.save, waiting for the other ranks)`` for one rank's record."""
    where = record.get("short") or record["where"]
    waiting = record.get("waiting", record["waiting_in_torch"])
    call = record.get("call")
    if waiting:
        return f"{where} (in {call}, waiting for the other ranks)" if call else f"{where} (waiting)"
    return f"{where} (in {call})" if call else where


def diagnose(directory: Path) -> dict[str, Any] | None:
    """Which ranks stalled, from the watchdogs' records; None when none fired. A cause named by
    comparing the ranks' collectives (``diagnosis.json``) comes first."""
    records = [json.loads(p.read_text()) for p in sorted(directory.glob("rank*.json"))]
    named = directory / "diagnosis.json"
    if named.exists():
        cause = json.loads(named.read_text())
        summary = f"{cause['kind']}: {cause['summary']}"
        return {"stalled": cause["ranks"], "records": records, "summary": summary}
    if not records:
        return None
    stalled = [r for r in records if not r.get("waiting", r["waiting_in_torch"])]
    everyone_waits = not stalled
    if everyone_waits:  # the lowest step is the one behind
        low = min(r["step"] for r in records)
        stalled = [r for r in records if r["step"] == low]
    summary = "; ".join(f"rank {r['rank']} at step {r['step']}: {describe(r)}" for r in stalled)
    calls = {r.get("call") for r in records}
    if everyone_waits and len(calls) > 1:
        summary += (
            " (the ranks wait in different collectives: one was called on some ranks only, "
            "e.g. under `if run.rank == 0`; every rank must call it)"
        )
    return {"stalled": [r["rank"] for r in stalled], "records": records, "summary": summary}
