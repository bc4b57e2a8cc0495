"""The tracker settings of ``RunConfig``, checked (``config.py``'s table calls these) and turned
into the names of the trackers to run.

    selected(["mlflow"], tensorboard=True)       # ("tensorboard", "mlflow")
    check_log_to("log_to", "mlfow")             # ConfigError: ... Did you mean 'mlflow'?
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Protocol

from paratrain.errors import ConfigError

TRACKER_NAMES = ("tensorboard", "mlflow", "wandb")
"""Every name ``log_to`` takes."""
_NOT_IN_WANDB_NAMES = "/\\#?%:"


class TrackerSettings(Protocol):
    """The settings trackers read (a ``RunConfig`` has them)."""

    log_to: str | list[str] | tuple[str, ...] | None
    tensorboard: bool
    tracker_project: str
    tracker_run_name: str | None
    mlflow_tracking_uri: str | None


def selected(log_to: str | Sequence[str] | None, tensorboard: bool) -> tuple[str, ...]:
    """The tracker names ``log_to`` (one name or several) and ``tensorboard=True`` ask for."""
    names = [log_to] if isinstance(log_to, str) else list(log_to or ())
    if tensorboard:
        names.insert(0, "tensorboard")
    return tuple(dict.fromkeys(names))


def check_log_to(name: str, value: object) -> None:
    """``log_to``: None, a tracker name, or a list or tuple of them."""
    if value is None:
        return
    names = [value] if isinstance(value, str) else value
    known = ", ".join(TRACKER_NAMES)
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            f"{name} must be a tracker name or a list of them ({known}), got {value!r}. Pass "
            f"e.g. {name}=['tensorboard', 'mlflow'] or {name}='wandb'."
        )
    for tracker in names:
        if tracker not in TRACKER_NAMES:
            parts = [p.strip() for p in tracker.replace(";", ",").split(",")]
            close = difflib.get_close_matches(tracker, TRACKER_NAMES, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            if len(parts) > 1 and all(p in TRACKER_NAMES for p in parts):
                hint = f" Several trackers go in a list: {name}={parts!r}."
            raise ConfigError(
                f"Unknown tracker {tracker!r} in {name}.{hint} Known trackers: {known}. Pass "
                f"e.g. {name}=['mlflow'], or several: {name}=['tensorboard', 'mlflow', 'wandb']."
            )
    twice = sorted({n for n in names if list(names).count(n) > 1})
    if twice:
        raise ConfigError(
            f"{name} names {', '.join(repr(n) for n in twice)} more than once; each tracker is "
            f"one run. Pass each once, e.g. {name}={list(dict.fromkeys(names))!r}."
        )


def check_project(name: str, value: object) -> None:
    """``tracker_project``: 1 to 256 characters without control characters (an MLflow
    experiment may be a workspace path, ``/Users/me/exp``; wandb's stricter rule is checked
    when wandb is selected)."""
    if not isinstance(value, str) or not 0 < len(value) <= 256 or _bad_text(value, ""):
        raise ConfigError(
            f"{name} must be a name of 1 to 256 characters without control characters (the "
            f"MLflow experiment and wandb project), got {value!r}. Pass e.g. {name}='digits'."
        )


def check_run_name(name: str, value: object) -> None:
    """``tracker_run_name``: None or 1 to 128 characters without control characters."""
    if value is not None and (
        not isinstance(value, str) or not 0 < len(value) <= 128 or _bad_text(value, "")
    ):
        raise ConfigError(
            f"{name} must be None (the run dir's name) or a name of 1 to 128 characters without "
            f"control characters, got {value!r}. Pass e.g. {name}='baseline-lr3e-4'."
        )


def check_uri(name: str, value: object) -> None:
    """``mlflow_tracking_uri``: None or a URI (``http://host:5000``, ``file:/abs/mlruns``)."""
    if value is not None and (
        not isinstance(value, str) or not 0 < len(value) <= 4096 or _bad_text(value, "")
    ):
        raise ConfigError(
            f"{name} must be None (MLFLOW_TRACKING_URI, else run_dir/mlruns) or a tracking URI, "
            f"got {value!r}. Pass e.g. {name}='http://localhost:5000' or 'file:/data/mlruns'."
        )


def check_combination(settings: TrackerSettings) -> None:
    """Settings that only one tracker reads need that tracker in ``log_to``; a wandb project
    name has wandb's own rule."""
    names = selected(settings.log_to, settings.tensorboard)
    project = settings.tracker_project
    if "wandb" in names and (len(project) > 128 or _bad_text(project, _NOT_IN_WANDB_NAMES)):
        raise ConfigError(
            f"tracker_project={project!r} cannot name a wandb project: at most 128 characters, "
            f"none of {' '.join(_NOT_IN_WANDB_NAMES)}. Pass e.g. tracker_project='digits'."
        )
    if settings.mlflow_tracking_uri is not None and "mlflow" not in names:
        raise ConfigError(
            f"mlflow_tracking_uri={settings.mlflow_tracking_uri!r} is set, but log_to="
            f"{settings.log_to!r} does not include 'mlflow', so nothing would go there. Add it: "
            "log_to=['mlflow'], or drop mlflow_tracking_uri."
        )


def _bad_text(value: str, forbidden: str) -> bool:
    return any(ch in forbidden or not ch.isprintable() for ch in value)
