"""MLflow, read back through ``MlflowClient`` from a real local file store: metric history with its
steps, the hyper-parameters logged once, one FINISHED run; a store that cannot be used is an error
at the tracker's start."""

from __future__ import annotations

from pathlib import Path

import pytest

import paratrain as pt
from paratrain.errors import EnvironmentMismatchError
from tests.trackers.records import mlflow_client
from tests.trackers.training import train


def test_metrics_and_hyperparameters_reach_one_mlflow_run(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    runs = train(
        tmp_path / "exp1",
        steps=4,
        log_to="mlflow",
        mlflow_tracking_uri=uri,
        tracker_project="digits",
        extra={"lr": 0.1, "model": {"width": 64}, "tags": ["a", "b"]},
    )
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name("digits")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == runs["mlflow"]["run_id"]
    assert run.info.run_name == "exp1" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in history] == [1, 2, 3, 4]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "attempt")] == [1.0] * 4
    params = run.data.params
    assert params["extra.lr"] == "0.1" and params["extra.model.width"] == "64"
    assert params["extra.tags"] == '["a", "b"]'
    assert params["strategy"] == "cpu" and params["world_size"] == "1"  # resolved, not "auto"
    assert params["log_to"] == "mlflow" and params["seed"] == "0"
    assert "started" not in params and "restart_count" not in params
    assert run.data.tags["paratrain.core.run_dir"] == str((tmp_path / "exp1").resolve())


def test_the_default_store_is_run_dir_mlruns_and_mlflow_env_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = train(tmp_path / "a", steps=1, log_to=["mlflow"])
    assert runs["mlflow"]["tracking_uri"] == (tmp_path / "a" / "mlruns").resolve().as_uri()
    assert len(mlflow_client(runs["mlflow"]["tracking_uri"]).search_experiments()) >= 1
    elsewhere = (tmp_path / "shared").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", elsewhere)
    runs = train(tmp_path / "b", steps=1, log_to=["mlflow"], tracker_run_name="second")
    assert runs["mlflow"]["tracking_uri"] == elsewhere
    (run,) = mlflow_client(elsewhere).search_runs(["0", runs["mlflow"]["experiment_id"]])
    assert run.info.run_name == "second"
    assert not (tmp_path / "b" / "mlruns").exists()


def test_a_store_that_cannot_be_used_is_an_error_naming_the_setting(tmp_path: Path) -> None:
    with (
        pt.Run(
            strategy="cpu",
            run_dir=tmp_path,
            progress=False,
            log_to="mlflow",
            mlflow_tracking_uri="nosuchscheme://host/x",
        ) as run,
        pytest.raises(EnvironmentMismatchError) as err,
    ):
        run.log({"loss": 1.0}, step=1)
    message = str(err.value)
    assert "nosuchscheme://host/x" in message and "mlflow_tracking_uri" in message, message


def test_a_server_that_refuses_connections_fails_at_once(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:  # a port nobody listens on
        taken.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{taken.getsockname()[1]}"
    settings = {"log_to": "mlflow", "mlflow_tracking_uri": uri}
    with (
        pt.Run(strategy="cpu", run_dir=tmp_path, progress=False, **settings) as run,
        pytest.raises(EnvironmentMismatchError) as err,
    ):
        run.log({"loss": 1.0}, step=1)  # not after MLflow's minutes of HTTP retries
    assert "no connection to 127.0.0.1" in str(err.value), err.value
