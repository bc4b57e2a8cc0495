"""Two real gloo ranks that both call ``run.log``: only the main process creates tracker runs or
imports a tracker package, so each tracker has exactly one run with each step once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from paratrain.checkpoint.restore import load_trainer
from paratrain.trackers import STATE_NAME
from tests.support.distributed import run_distributed
from tests.trackers.records import mlflow_client, tensorboard_scalars
from tests.trackers.training import train

pytestmark = pytest.mark.dist
PACKAGES = ("mlflow", "wandb", "tensorboard", "torch.utils.tensorboard")


def _log_on_every_rank(run_dir: str, uri: str) -> dict[str, Any]:
    runs = train(
        Path(run_dir),
        steps=3,
        save_at=3,
        strategy="ddp",
        timeout_s=60,
        log_to=["mlflow", "tensorboard"],
        mlflow_tracking_uri=uri,
    )
    return {"runs": runs, "imported": [name for name in PACKAGES if name in sys.modules]}


def test_only_the_main_process_logs_to_one_tracker_run(tmp_path: Path) -> None:
    uri = (tmp_path / "store").as_uri()
    main, other = run_distributed(_log_on_every_rank, 2, str(tmp_path / "run"), uri)
    assert other == {"runs": {}, "imported": []}
    assert set(main["runs"]) == {"mlflow", "tensorboard"} and "mlflow" in main["imported"]
    (folder,) = (tmp_path / "run" / "checkpoints").iterdir()
    assert load_trainer(folder)["objects"][STATE_NAME]["runs"] == main["runs"]

    client = mlflow_client(uri)
    (run,) = client.search_runs([main["runs"]["mlflow"]["experiment_id"]])
    assert run.data.params["world_size"] == "2" and run.data.params["strategy"] == "ddp"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3]
    log_dir = tmp_path / "run" / "tensorboard"
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1
    assert [step for step, _ in tensorboard_scalars(log_dir, "loss")] == [1, 2, 3]
