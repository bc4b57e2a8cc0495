"""Diagnose hangs: when a rank makes no progress, dump where every thread is, then exit.

    dog = Watchdog(run_dir / "stacks", rank=1, after_s=480, exit_after_dump=True)
    dog.progress(step=120)      # from Run.step / backward / barrier
    ...
    dog.stop()

Each rank's watchdog fires on its own (the healthy ranks are stuck in a collective, the stalled
one in user code), writes ``stacks/rank<r>.txt`` (all Python stacks, via faulthandler) and
``stacks/rank<r>.json`` (step, seconds idle, innermost frame, whether it waits inside torch),
and ends the process so that no rank hangs forever. :func:`diagnose` reads the JSON files and
names the stalled rank(s): the ones that are *not* waiting inside torch.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

_TORCH_PARTS = (f"{os.sep}torch{os.sep}", f"{os.sep}paratrain{os.sep}")


class Watchdog:
    """A daemon thread that fires once ``after_s`` seconds pass without progress."""

    def __init__(
        self, directory: Path, *, rank: int, after_s: float, exit_after_dump: bool = True
    ) -> None:
        self.directory, self.rank, self.after_s = directory, rank, after_s
        self.exit_after_dump = exit_after_dump
        self.step = 0
        self._last = time.monotonic()
        self._main = threading.main_thread()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="paratrain-watchdog", daemon=True)
        self._thread.start()

    def progress(self, step: int) -> None:
        """Note that the training loop moved (cheap: two assignments)."""
        self.step = step
        self._last = time.monotonic()

    def stop(self) -> None:
        """End the watch (the run closed normally)."""
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.after_s / 4)):
            idle = time.monotonic() - self._last
            if idle >= self.after_s:
                self.dump(idle)
                if self.exit_after_dump:
                    os._exit(75)  # EX_TEMPFAIL: a restart may help
                return

    def dump(self, idle: float) -> Path:
        """Write this rank's stacks and a one-line verdict; return the JSON path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        frames = sys._current_frames().get(self._main.ident or -1)
        stack = traceback.extract_stack(frames) if frames is not None else []
        inner = stack[-1] if stack else None
        in_torch = inner is not None and any(p in inner.filename for p in _TORCH_PARTS)
        with (self.directory / f"rank{self.rank}.txt").open("w") as f:
            f.write(f"rank {self.rank}: no progress for {idle:.0f}s after step {self.step}\n")
            faulthandler.dump_traceback(file=f, all_threads=True)
        where = f"{inner.filename}:{inner.lineno} in {inner.name}" if inner else "?"
        record = {
            "rank": self.rank,
            "step": self.step,
            "idle_s": round(idle, 1),
            "waiting_in_torch": in_torch,
            "time": time.time(),
            "where": where,
        }
        path = self.directory / f"rank{self.rank}.json"
        path.write_text(json.dumps(record))
        print(
            f"paratrain: rank {self.rank} made no progress for {idle:.0f}s after step "
            f"{self.step} ({'waiting inside torch' if in_torch else 'in ' + where}); "
            f"stacks in {self.directory}",
            file=sys.stderr,
            flush=True,
        )
        return path


def diagnose(directory: Path) -> dict[str, Any] | None:
    """Which ranks stalled, from the watchdogs' records; None when none fired."""
    records = [json.loads(p.read_text()) for p in sorted(directory.glob("rank*.json"))]
    if not records:
        return None
    stalled = [r for r in records if not r["waiting_in_torch"]]
    if not stalled:  # everyone waits in torch: the lowest step is the one behind
        low = min(r["step"] for r in records)
        stalled = [r for r in records if r["step"] == low]
    return {
        "stalled": [r["rank"] for r in stalled],
        "records": records,
        "summary": "; ".join(
            f"rank {r['rank']} at step {r['step']}: {r['where']}" for r in stalled
        ),
    }
