"""What every tracker module implements, and the hyper-parameters in the shapes trackers take.

    tracker = MlflowTracker(options)          # paratrain.trackers.mlflow, .wandb, .tensorboard
    state = tracker.start(None, None, {"lr": 0.1}, warn)   # a fresh run: {"run_id": ...}
    tracker.log({"loss": 0.3}, 10)
    tracker.close()

``start`` with the state a checkpoint saved (and the checkpoint's step) reopens that run instead
and does not log the hyper-parameters again. A tracker imports its package in ``start``, never at
import time, so that a module of this package can be imported on any rank for free.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from paratrain.core.run_dir import RunDir

Warn = Callable[[str], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrackerOptions:
    """The settings trackers share (from ``RunConfig``), resolved for this run."""

    project: str
    """MLflow experiment and wandb project (``tracker_project``)."""
    run_name: str
    """MLflow run name and wandb display name (``tracker_run_name``, default the run dir's name)."""
    mlflow_uri: str | None
    """``mlflow_tracking_uri`` as given (None: MLFLOW_TRACKING_URI, else run_dir/mlruns)."""
    layout: RunDir
    """The run dir, where TensorBoard, the default MLflow store and wandb's folders go."""


class Tracker(Protocol):
    """One experiment tracker, used by the main process only."""

    name: str

    def start(
        self,
        saved: Mapping[str, Any] | None,
        saved_step: int | None,
        hparams: Mapping[str, Any],
        warn: Warn,
    ) -> dict[str, Any]:
        """Open a run (``saved``: reopen the checkpoint's, which goes on after ``saved_step``;
        -1 when nothing it logged is kept) and return its state as plain data. A failure raises
        a ParatrainError that names the fix."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record scalars at ``step``."""

    def close(self) -> None:
        """Finish the run and flush everything."""


def flat_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """``{"extra": {"lr": 0.1}}`` as ``{"extra.lr": 0.1}``; lists and None become text."""
    flat: dict[str, bool | int | float | str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flat_params(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return flat


_UNSAFE = re.compile(r"[^\w.\- /]")


def safe_key(key: str) -> str:
    """A metric or parameter name every tracker accepts (MLflow's rule is the strictest:
    letters, digits, ``_ - . /`` and spaces; no empty, ``.`` or ``..`` path parts)."""
    parts = [p for p in _UNSAFE.sub("_", key).split("/") if p not in ("", ".", "..")]
    return "/".join(parts)[:250] or "_"
