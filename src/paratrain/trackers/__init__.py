"""Experiment trackers: ``Run(log_to=[...])`` sends ``run.log`` scalars and the run's
hyper-parameters to TensorBoard, MLflow and Weights & Biases, from the main process only.

    trackers = open_trackers(config, layout, is_main=True, hparams=run_json, step=current_step)
    trackers.log({"loss": 0.3}, 10)     # the first call starts each tracker's run
    trackers.state_dict()               # {"step": 10, "runs": {"mlflow": {"run_id": ...}, ...}}
    trackers.load_state_dict(state)     # a resumed run: the next start reopens those runs
    trackers.set_job("job-1a2b", restarted=True)  # a restart without a checkpoint: the runs of
                                                  # the job's earlier attempt are continued
    trackers.close()                    # MLflow: FINISHED, wandb: finish, TensorBoard: flushed

One module per tracker (``tensorboard``, ``mlflow``, ``wandb``), each a class behind
:class:`paratrain.trackers.protocol.Tracker`; this module is the one place a tracker name is
branched on. The run registers its :class:`Trackers` with the checkpoint registry under
:data:`STATE_NAME`, so every checkpoint holds the tracker run ids (plain data) and a resume
continues the same tracker runs. Each start also records the job id and its runs in
``run_dir/tracker-runs.json``: a torchrun restart that comes before the first save (nothing to
resume) continues those runs, with what the failed attempt logged hidden in TensorBoard, instead
of leaving an MLflow run RUNNING forever and TensorBoard showing every step twice. Off the main
process a :class:`Trackers` holds no tracker and imports no tracker package.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from paratrain.core.run_dir import RunDir
from paratrain.errors import EnvironmentMismatchError
from paratrain.trackers.mlflow import MlflowTracker
from paratrain.trackers.protocol import Tracker, TrackerOptions
from paratrain.trackers.settings import TRACKER_NAMES, TrackerSettings, selected
from paratrain.trackers.tensorboard import TensorBoardTracker
from paratrain.trackers.wandb import WandbTracker

__all__ = [
    "STATE_NAME",
    "TRACKER_NAMES",
    "TrackerSettings",
    "Trackers",
    "hyperparameters",
    "open_trackers",
    "selected",
]

STATE_NAME = "paratrain-trackers"
"""The name the run's :class:`Trackers` is registered under in every checkpoint."""
_KINDS: dict[str, Callable[[TrackerOptions], Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "mlflow": MlflowTracker,
    "wandb": WandbTracker,
}
_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
"""The package each tracker needs (also the name of paratrain's pip extra that installs it)."""


def open_trackers(
    settings: TrackerSettings,
    layout: RunDir,
    *,
    is_main: bool,
    hparams: Callable[[], Mapping[str, Any]],
    step: Callable[[], int],
) -> Trackers:
    """The selected trackers on the main process (none elsewhere), not started yet.

    Each one's package must be installed: checked now, without importing it, so a missing one
    fails ``pt.Run(...)`` instead of the first ``run.log``. ``hparams()`` gives the ``run.json``
    record (read when a tracker run is created); ``step()`` the step a checkpoint is saved at."""
    if not is_main:
        return Trackers(hparams=hparams, step=step)
    names = selected(settings.log_to, settings.tensorboard)
    for name in names:
        _require(name)
    options = TrackerOptions(
        project=settings.tracker_project,
        run_name=settings.tracker_run_name or layout.root.resolve().name,
        mlflow_uri=settings.mlflow_tracking_uri,
        layout=layout,
    )
    return Trackers(
        [_KINDS[name](options) for name in names],
        hparams=hparams,
        step=step,
        record=layout.tracker_runs,
    )


def _require(name: str) -> None:
    package = _PACKAGES[name]
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent that fails to import, a module without spec
        found = False
    if not found:
        how = "tensorboard=True or " if name == "tensorboard" else ""
        raise EnvironmentMismatchError(
            f"{how}log_to={name!r} needs the {package} package, which is not installed. Run "
            f"`pip install 'paratrain[{name}]'`, or leave {name!r} out of log_to"
            f"{' and pass tensorboard=False' if how else ''}."
        )


def hyperparameters(record: Mapping[str, Any]) -> dict[str, Any]:
    """What trackers log as hyper-parameters, from the ``run.json`` record: every setting by
    name (strategy and backend as resolved), paratrain and torch versions, world size, device,
    and ``extra`` (nested). What differs between restarts (start time, restart count) is left
    out, so a resumed tracker run's parameters stay those it started with."""
    settings = dict(record.get("settings") or {})
    facts = {k: v for k, v in record.items() if k not in ("settings", "started", "restart_count")}
    return {**settings, **facts}


class Trackers:
    """The selected trackers of one run, started together at the first use.

    ``state_dict``/``load_state_dict`` make it a checkpointed object: the step of the save and
    each tracker run's ids. A failure while logging is reported once per tracker and does not
    stop training; a tracker that cannot start is an error."""

    def __init__(
        self,
        trackers: Sequence[Tracker] = (),
        *,
        hparams: Callable[[], Mapping[str, Any]] = dict,
        step: Callable[[], int] = int,
        record: Path | None = None,
    ) -> None:
        self.trackers = list(trackers)
        self.warn: Callable[[str], None] = _warn
        """Where failures are reported (the run's console sets it)."""
        self._hparams, self._step = hparams, step
        self._open: dict[str, dict[str, Any]] = {}
        self._saved: dict[str, dict[str, Any]] = {}
        self._saved_step: int | None = None
        self._failures: dict[str, int] = {}
        self._started = self._closed = False
        self._record = record
        self._job: str | None = None
        self._restarted = False

    @property
    def names(self) -> list[str]:
        """The selected trackers, e.g. ``['tensorboard', 'mlflow']`` (``[]`` off the main rank)."""
        return [t.name for t in self.trackers]

    @property
    def runs(self) -> dict[str, dict[str, Any]]:
        """Each started tracker's run: ``{"mlflow": {"run_id": ...}, "wandb": {"id": ...}}``."""
        return {name: dict(state) for name, state in self._open.items()}

    def set_job(self, job: str, *, restarted: bool) -> None:
        """The job these runs belong to. ``restarted`` (a torchrun restart): when no checkpoint
        gives the runs to continue, those the job's earlier attempt recorded are continued from
        step 0 (TensorBoard hides everything that attempt logged)."""
        self._job, self._restarted = job, restarted

    def start(self) -> None:
        """Open every tracker's run (a saved one after a resume); a no-op once started."""
        if self._started or self._closed or not self.trackers:
            return
        self._started = True
        atexit.register(self.close)  # a script that never closes its Run still ends its runs
        if not self._saved and self._restarted:
            earlier = self._recorded_runs()
            if earlier:
                self._saved, self._saved_step = earlier, -1  # nothing of that attempt is kept
        params = hyperparameters(self._hparams())
        for tracker in self.trackers:
            saved = self._saved.get(tracker.name)
            saved_step = self._saved_step if saved is not None else None
            self._open[tracker.name] = tracker.start(saved, saved_step, params, self.warn)
        self._record_runs()

    def _recorded_runs(self) -> dict[str, dict[str, Any]]:
        """The runs this job's earlier attempt recorded ({} when none, or another job's)."""
        if self._record is None or self._job is None:
            return {}
        try:
            record = json.loads(self._record.read_text())
        except (OSError, ValueError):
            return {}
        runs = record.get("runs") if isinstance(record, dict) else None
        if record.get("job") != self._job or not isinstance(runs, dict):
            return {}
        return {str(k): dict(v) for k, v in runs.items() if isinstance(v, dict)}

    def _record_runs(self) -> None:
        if self._record is None or self._job is None:
            return
        try:
            self._record.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._record.with_name(f".{self._record.name}.tmp")
            tmp.write_text(json.dumps({"job": self._job, "runs": self.runs}) + "\n")
            os.replace(tmp, self._record)
        except (OSError, TypeError, ValueError) as err:
            self.warn(f"could not record the tracker runs in {self._record} ({err})")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Send ``metrics`` at ``step`` to every tracker; a failing one warns once."""
        if self._closed or not self.trackers:
            return
        self.start()
        for tracker in self.trackers:
            if tracker.name not in self._open:
                continue  # it failed to start, and said so
            try:
                tracker.log(metrics, step)
            except Exception as err:
                count = self._failures[tracker.name] = self._failures.get(tracker.name, 0) + 1
                if count == 1:
                    self.warn(
                        f"{tracker.name} could not log step {step} ({type(err).__name__}: {err}). "
                        "Training goes on; metrics.jsonl and the other trackers still get every "
                        f"value, and further {tracker.name} failures are only counted."
                    )

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's share: its step and the tracker runs (started first, so that every
        checkpoint names the runs a resume continues). Plain data."""
        self.start()
        runs = {**self._saved, **self.runs}  # runs of trackers left out this time are kept
        return {"step": int(self._step()), "runs": runs}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the checkpoint's tracker runs: from the next start, or now if other tracker
        runs were started before the resume (they are closed, and the saved ones reopened)."""
        runs, step = state.get("runs"), state.get("step")
        if not isinstance(runs, dict):
            runs = {}
        self._saved = {str(k): dict(v) for k, v in runs.items() if isinstance(v, dict)}
        self._saved_step = step if isinstance(step, int) and not isinstance(step, bool) else None
        opened = self._open.items()
        if not self._closed and any(self._saved.get(name) != run for name, run in opened):
            self.warn(
                f"tracker runs were opened before run.resume() (by a run.log or run.save): "
                f"{self.runs} are closed and the checkpoint's are continued. Resume before the "
                "first run.log to leave no extra tracker runs."
            )
            self._close_open()
            self._open.clear()
            self._started = False
            self.start()

    def close(self) -> None:
        """Finish every tracker run and report log failures; nothing is started here."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        with _sigterm_after():
            self._close_open()
        for name, count in self._failures.items():
            self.warn(f"{name}: {count} log call(s) failed in this run")

    def _close_open(self) -> None:
        for tracker in self.trackers:
            if tracker.name in self._open:
                try:
                    tracker.close()
                except Exception as err:
                    self.warn(f"{tracker.name} could not finish its run ({err})")


def _warn(message: str) -> None:
    print(f"paratrain: warning: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _sigterm_after() -> Iterator[None]:
    """Hold a SIGTERM until the block ends, then die of it. Closing writes the trackers' run
    records (MLflow's file store rewrites meta.yaml in place): torchrun stops the surviving
    ranks with SIGTERM when one fails, and a record cut in half would keep the restarted job from
    continuing the run. Only the main thread can install a handler; elsewhere nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if received:
            os.kill(os.getpid(), signal.SIGTERM)
