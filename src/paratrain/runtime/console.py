"""Output that happens once per job, not once per rank: text, progress bars, scalars.

    console = Console(is_main=rank == 0, run_dir="runs/exp", progress=True, trackers=trackers)
    console.print("epoch 1 done")                  # main process only
    for batch in console.progress(loader, desc="epoch 1"):
        ...
    console.log({"loss": 0.3}, step=10)            # metrics.jsonl (+ the trackers) on rank 0
    console.logger(__name__).info("saved")          # a logging.Logger silent off rank 0

The experiment trackers (``log_to``: TensorBoard, MLflow, wandb) are
:class:`paratrain.trackers.Trackers`, made by the job with the main process's flag.

This is the one place the "only rank 0 prints or writes shared files" rule lives.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sized
from pathlib import Path
from typing import Any, TypeVar

from paratrain.core.run_dir import RunDir
from paratrain.trackers import Trackers

T = TypeVar("T")


class Console:
    """Rank-aware printing, progress and scalar logging."""

    def __init__(
        self,
        *,
        is_main: bool,
        run_dir: str | Path,
        progress: bool,
        trackers: Trackers | None = None,
    ) -> None:
        self.is_main = is_main
        self.layout = RunDir(run_dir)
        self.show_progress = progress
        self.trackers = trackers if trackers is not None else Trackers()
        """Where :meth:`log` also goes (``log_to``); none off the main process."""
        self.trackers.warn = self.warn
        self._metrics: Any = None

    def print(
        self,
        *values: object,
        sep: str | None = " ",
        end: str | None = "\n",
        file: Any = None,
        flush: bool = True,
    ) -> None:
        """``print`` on the main process (with print's keywords; always flushed, so lines of
        several ranks and of paratrain keep their order); a no-op elsewhere."""
        if self.is_main:
            print(*values, sep=sep, end=end, file=file or sys.stdout, flush=True)

    def warn(self, message: str) -> None:
        """A one-line warning on stderr from the main process."""
        self.print(f"paratrain: warning: {message}", file=sys.stderr)

    def progress(self, iterable: Iterable[T], *, desc: str | None = None) -> Iterator[T]:
        """A tqdm bar on the main process (when enabled); the bare iterable elsewhere."""
        if not (self.is_main and self.show_progress):
            yield from iterable
            return
        from tqdm.auto import tqdm

        total = len(iterable) if isinstance(iterable, Sized) else None
        with tqdm(iterable, desc=desc, total=total, dynamic_ncols=True, leave=False) as bar:
            yield from bar

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        """Append ``metrics`` to ``run_dir/metrics.jsonl`` and send them to the trackers (main
        process only)."""
        if not self.is_main:
            return
        if self._metrics is None:
            self.layout.root.mkdir(parents=True, exist_ok=True)
            self._metrics = self.layout.metrics.open("a", encoding="utf-8")
        values = {k: float(v) for k, v in metrics.items()}
        self._metrics.write(json.dumps({"step": step, "time": time.time(), **values}) + "\n")
        self._metrics.flush()
        self.trackers.log(values, step)

    def logger(self, name: str) -> logging.Logger:
        """A ``logging`` logger whose records are dropped on every rank but the main one."""
        logger = logging.getLogger(name)
        if not any(isinstance(f, _MainProcessOnly) for f in logger.filters):
            logger.addFilter(_MainProcessOnly(self.is_main))
        return logger

    def close(self) -> None:
        """Finish the tracker runs; flush and close the files this console opened."""
        self.trackers.close()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None


class _MainProcessOnly(logging.Filter):
    def __init__(self, is_main: bool) -> None:
        super().__init__()
        self.is_main = is_main

    def filter(self, record: logging.LogRecord) -> bool:
        return self.is_main
