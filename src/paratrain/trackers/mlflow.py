"""MLflow: ``run.log`` scalars as metric history, the hyper-parameters as params, one MLflow run
per paratrain run (resumes included).

    tracker = MlflowTracker(options)     # tracking URI: mlflow_tracking_uri, MLFLOW_TRACKING_URI,
                                         # else a file store in run_dir/mlruns
    tracker.start(None, None, hparams, warn)    # {"run_id": ..., "tracking_uri": ..., ...}
    tracker.log({"loss": 0.3}, 10)
    tracker.close()                      # the run is FINISHED

It talks to the store through an ``MlflowClient``, not MLflow's global active run, so a script's
own ``mlflow.start_run()`` is left alone. A resumed run reopens the checkpoint's run id (params
are not logged again: MLflow refuses to change them); steps the crashed run logged after the
checkpoint stay in the history next to the new values.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from paratrain.errors import EnvironmentMismatchError
from paratrain.trackers.protocol import TrackerOptions, Warn, flat_params, safe_key

_VALUE_LENGTH = 6000  # MLflow's limit on a param value (mlflow.utils.validation)


class MlflowTracker:
    """One MLflow run in the ``tracker_project`` experiment."""

    name = "mlflow"

    def __init__(self, options: TrackerOptions) -> None:
        self.uri = (
            options.mlflow_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or options.layout.mlruns.resolve().as_uri()
        )
        self.experiment = options.project
        self.run_name = options.run_name
        self.run_dir = str(options.layout.root.resolve())
        self.run_id: str | None = None
        self._client: Any = None

    def start(
        self,
        saved: Mapping[str, Any] | None,
        saved_step: int | None,
        hparams: Mapping[str, Any],
        warn: Warn,
    ) -> dict[str, Any]:
        """Reopen the checkpoint's run, or create one and log the hyper-parameters."""
        if self.uri.startswith("file:") or "://" not in self.uri:
            # MLflow 3 refuses its file store unless asked; a file store is what was asked for.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            _check_reachable(self.uri)  # MLflow's own retries take minutes to give up
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri)
            saved = saved or {}
            saved_id = saved.get("run_id")
            if isinstance(saved_id, str) and self._reopen(saved_id, saved, warn):
                self.run_id = saved_id
            else:
                self.run_id = self._create(hparams)
            experiment_id = self._client.get_run(self.run_id).info.experiment_id
        except Exception as err:
            raise EnvironmentMismatchError(
                f"MLflow could not start a run at tracking URI {self.uri!r} ({type(err).__name__}: "
                f"{err}). Check mlflow_tracking_uri (or MLFLOW_TRACKING_URI) and that the server "
                "is reachable, or leave 'mlflow' out of log_to."
            ) from err
        return {"run_id": self.run_id, "experiment_id": experiment_id, "tracking_uri": self.uri}

    def _reopen(self, run_id: str, saved: Mapping[str, Any], warn: Warn) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            run = self._client.get_run(run_id)
        except MlflowException as err:
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            warn(
                f"the checkpoint's MLflow run {run_id} is not at {self.uri} (it was logged to "
                f"{saved.get('tracking_uri')}); logging to a new MLflow run"
            )
            return False
        except Exception as err:  # e.g. a file store record cut short by a killed process
            warn(
                f"the checkpoint's MLflow run {run_id} at {self.uri} cannot be read "
                f"({type(err).__name__}: {err}); logging to a new MLflow run"
            )
            return False
        if run.info.status != "RUNNING":
            self._client.update_run(run_id, status="RUNNING")
        return True

    def _create(self, hparams: Mapping[str, Any]) -> str:
        from mlflow.entities import Param

        experiment = self._client.get_experiment_by_name(self.experiment)
        if experiment is None:
            experiment_id = self._client.create_experiment(self.experiment)
        else:
            experiment_id = experiment.experiment_id
        tags = {"paratrain.core.run_dir": self.run_dir}
        run = self._client.create_run(experiment_id, run_name=self.run_name, tags=tags)
        values = {safe_key(k): str(v)[:_VALUE_LENGTH] for k, v in flat_params(hparams).items()}
        params = [Param(k, v) for k, v in values.items()]
        self._client.log_batch(run.info.run_id, params=params)
        return str(run.info.run_id)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """All of ``metrics`` in one batch, at ``step``."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(safe_key(k), v, now, step) for k, v in metrics.items()]
        self._client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        """Mark the run FINISHED."""
        if self.run_id is not None:
            self._client.set_terminated(self.run_id)
            self.run_id = None


def _check_reachable(uri: str, timeout_s: float = 10.0) -> None:
    """Raise ``ConnectionError`` at once when an http(s) tracking server refuses or does not
    answer a TCP connection (other URIs: nothing to check here)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as err:
        raise ConnectionError(
            f"no connection to {parts.hostname}:{port} within {timeout_s:.0f} s ({err})"
        ) from None
