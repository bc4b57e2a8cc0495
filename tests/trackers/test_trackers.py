"""Selecting trackers (``log_to``, ``tensorboard=True``), refusing bad ones at ``pt.Run(...)``, and
the fan-out: main process only, a failing tracker warns once and training goes on."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import paratrain as pt
from paratrain.checkpoint.restore import load_trainer
from paratrain.core.run_dir import RunDir
from paratrain.errors import ConfigError, EnvironmentMismatchError
from paratrain.trackers import STATE_NAME, Trackers, open_trackers, selected
from tests.trackers.training import train


@pytest.mark.parametrize(
    "log_to,tensorboard,expected",
    [
        ((), False, ()),
        (None, True, ("tensorboard",)),
        ("mlflow", False, ("mlflow",)),
        (["wandb", "mlflow", "wandb"], True, ("tensorboard", "wandb", "mlflow")),
        (("tensorboard",), True, ("tensorboard",)),
    ],
)
def test_log_to_and_tensorboard_select_the_trackers(
    log_to: Any, tensorboard: bool, expected: tuple[str, ...]
) -> None:
    assert selected(log_to, tensorboard) == expected


@pytest.mark.parametrize(
    "settings,needles",
    [
        (dict(log_to="mlfow"), ["Unknown tracker 'mlfow' in log_to", "Did you mean 'mlflow'?"]),
        (dict(log_to=["tensorboard", "comet"]), ["'comet'", "tensorboard, mlflow, wandb"]),
        (dict(log_to=5), ["log_to must be a tracker name or a list of them", "got 5"]),
        (dict(log_to={"mlflow": True}), ["log_to must be a tracker name"]),
        (dict(log_to=[None]), ["log_to must be a tracker name"]),
        (dict(log_to="mlflow,tensorboard"), ["go in a list: log_to=['mlflow', 'tensorboard']"]),
        (dict(log_to=["mlflow", "mlflow"]), ["'mlflow' more than once"]),
        (dict(tracker_project="a\tb"), ["tracker_project must be a name", "'a\\tb'"]),
        (dict(log_to="wandb", tracker_project="a/b"), ["'a/b' cannot name a wandb project"]),
        (dict(tracker_project=""), ["tracker_project must be a name"]),
        (dict(tracker_run_name="x\ny"), ["tracker_run_name must be None"]),
        (dict(mlflow_tracking_uri=3), ["mlflow_tracking_uri must be None"]),
        (dict(mlflow_tracking_uri="http://h:5000"), ["does not include 'mlflow'"]),
    ],
)
def test_bad_tracker_settings_are_one_paragraph_naming_the_fix(
    settings: dict[str, Any], needles: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        pt.Run(progress=False, **settings)
    message = str(err.value)
    assert all(n in message for n in needles), message
    assert "\n" not in message and ("Pass" in message or "Add it" in message)
    assert not dist.is_initialized()


@pytest.mark.parametrize("name", ["mlflow", "wandb", "tensorboard"])
def test_a_missing_package_fails_the_run_at_creation(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    with pytest.raises(EnvironmentMismatchError) as err:
        pt.Run(strategy="ddp", run_dir=tmp_path, log_to=[name], progress=False)
    message = str(err.value)
    assert f"pip install 'paratrain[{name}]'" in message and "\n" not in message, message
    assert not dist.is_initialized()
    assert not (tmp_path / "run.json").exists()  # refused before anything was written


def test_other_ranks_get_no_trackers_and_check_no_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    config = pt.RunConfig(log_to=["wandb", "mlflow"])
    trackers = open_trackers(config, RunDir(tmp_path), is_main=False, hparams=dict, step=int)
    assert trackers.names == []
    trackers.log({"loss": 1.0}, 1)
    assert trackers.state_dict() == {"step": 0, "runs": {}}
    trackers.close()
    assert list(tmp_path.iterdir()) == []


class Broken:
    """A tracker whose every log call fails (a server gone away)."""

    name = "broken"

    def __init__(self) -> None:
        self.closed = False

    def start(self, saved: Any, saved_step: Any, hparams: Any, warn: Any) -> dict[str, Any]:
        return {"id": "b1"}

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        raise ConnectionError("server gone")

    def close(self) -> None:
        self.closed = True


def test_a_tracker_that_fails_to_log_warns_once_and_training_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = Broken()
    with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False) as run:
        run.console.trackers.trackers.append(broken)
        for step in range(1, 4):
            run.log({"loss": 1.0 / step}, step=step)
    err = capsys.readouterr().err
    assert err.count("broken could not log step 1 (ConnectionError: server gone)") == 1
    assert "broken: 3 log call(s) failed in this run" in err
    assert broken.closed
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]


def test_every_checkpoint_holds_the_tracker_state_even_without_trackers(tmp_path: Path) -> None:
    train(tmp_path, steps=2, save_at=2)
    (folder,) = (tmp_path / "checkpoints").iterdir()
    state = load_trainer(folder)["objects"][STATE_NAME]
    assert state == {"step": 2, "runs": {}}


def test_trackers_state_is_plain_and_carries_runs_of_trackers_not_selected_now() -> None:
    trackers = Trackers(step=lambda: 7)
    trackers.load_state_dict({"step": 3, "runs": {"wandb": {"id": "abc"}}})
    assert trackers.state_dict() == {"step": 7, "runs": {"wandb": {"id": "abc"}}}
    trackers.load_state_dict({"step": "x", "runs": ["junk"]})  # damaged: nothing to continue
    assert trackers.state_dict() == {"step": 7, "runs": {}}
