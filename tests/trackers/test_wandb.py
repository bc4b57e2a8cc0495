"""wandb in offline mode: the run folder under run_dir/wandb holds the config (every setting and
``extra``) and one history row per ``run.log``, plotted against paratrain's step."""

from __future__ import annotations

from pathlib import Path

from tests.trackers.records import wandb_runs
from tests.trackers.training import train


def test_offline_run_holds_config_and_history(tmp_path: Path) -> None:
    runs = train(
        tmp_path / "exp", steps=3, log_to="wandb", tracker_project="digits", extra={"lr": 0.5}
    )
    (run,) = wandb_runs(tmp_path / "exp")
    assert run.folder.name.startswith("offline-run-") and run.id == runs["wandb"]["id"]
    assert runs["wandb"]["project"] == "digits"
    assert run.config["extra"] == {"lr": 0.5} and run.config["strategy"] == "cpu"
    assert run.config["log_to"] == "wandb" and run.config["tracker_project"] == "digits"
    assert [row["step"] for row in run.history] == [1, 2, 3]
    assert [row["attempt"] for row in run.history] == [1, 1, 1]
    assert all(isinstance(row["loss"], float) for row in run.history)
