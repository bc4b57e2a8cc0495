"""A resumed run continues the same tracker runs: the checkpoint holds their ids, a new Run in the
same run dir reopens them at ``run.resume()``. The first run saves at step 3 and logs on to step 6
(what a crash would leave behind); the second resumes at step 3 and logs steps 4-6 again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from paratrain.checkpoint.restore import load_trainer
from paratrain.trackers import STATE_NAME
from tests.trackers.records import mlflow_client, tensorboard_scalars, wandb_runs
from tests.trackers.training import train

ALL = ["tensorboard", "mlflow", "wandb"]


def test_resume_continues_the_same_tracker_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = (tmp_path / "store").as_uri()
    settings: dict[str, Any] = dict(log_to=ALL, mlflow_tracking_uri=uri)
    first = train(tmp_path, steps=6, save_at=3, extra={"note": "first"}, **settings)
    (folder,) = (tmp_path / "checkpoints").iterdir()
    assert load_trainer(folder)["objects"][STATE_NAME] == {"step": 3, "runs": first}
    second = train(tmp_path, steps=6, resume=True, attempt=2, extra={"note": "2nd"}, **settings)
    assert second == first  # the same MLflow run id, wandb id, TensorBoard folder
    assert "opened before run.resume()" not in capsys.readouterr().err

    client = mlflow_client(uri)
    (run,) = client.search_runs([first["mlflow"]["experiment_id"]])
    assert run.info.run_id == first["mlflow"]["run_id"] and run.info.status == "FINISHED"
    assert run.data.params["extra.note"] == "first"  # logged once: MLflow cannot change params
    attempts = client.get_metric_history(run.info.run_id, "attempt")
    steps = [(m.step, int(m.value)) for m in attempts]
    assert sorted(steps) == sorted([(s, 1) for s in range(1, 7)] + [(s, 2) for s in (4, 5, 6)])

    old, new = wandb_runs(tmp_path)
    assert old.id == new.id == first["wandb"]["id"]
    assert old.config["extra"] == {"note": "first"} and "extra" not in new.config
    assert [(row["step"], row["attempt"]) for row in new.history] == [(4, 2), (5, 2), (6, 2)]
    assert [row["step"] for row in old.history] == [1, 2, 3, 4, 5, 6]

    # TensorBoard drops what the first run logged after the checkpoint: one value per step.
    shown = tensorboard_scalars(tmp_path / "tensorboard", "attempt")
    assert shown == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 2.0), (5, 2.0), (6, 2.0)]


def test_a_log_before_resume_switches_to_the_checkpoints_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import paratrain as pt

    uri = (tmp_path / "store").as_uri()
    first = train(tmp_path, steps=2, save_at=2, log_to=["mlflow"], mlflow_tracking_uri=uri)
    with pt.Run(
        strategy="cpu", run_dir=tmp_path, progress=False, log_to=["mlflow"], mlflow_tracking_uri=uri
    ) as run:
        from torch import nn

        run.setup(nn.Linear(4, 1))
        run.log({"early": 1.0}, step=0)  # opens a fresh MLflow run
        stray = run.console.trackers.runs["mlflow"]["run_id"]
        run.resume()
        assert run.console.trackers.runs == first
        run.log({"late": 1.0}, step=3)
    assert "opened before run.resume()" in capsys.readouterr().err
    client = mlflow_client(uri)
    assert [m.step for m in client.get_metric_history(first["mlflow"]["run_id"], "late")] == [3]
    assert client.get_run(stray).info.status == "FINISHED"


def test_an_mlflow_run_record_cut_short_by_a_kill_gives_a_new_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = (tmp_path / "store").as_uri()
    first = train(tmp_path, steps=4, save_at=3, log_to="mlflow", mlflow_tracking_uri=uri)
    run_id = first["mlflow"]["run_id"]
    (meta,) = (tmp_path / "store").glob(f"*/{run_id}/meta.yaml")
    meta.write_text("")  # what a process killed while MLflow rewrote it leaves
    second = train(tmp_path, steps=6, resume=True, log_to="mlflow", mlflow_tracking_uri=uri)
    assert second["mlflow"]["run_id"] != run_id  # training went on, in a new run
    assert f"MLflow run {run_id} at {uri} cannot be read" in capsys.readouterr().err


def test_sigterm_while_trackers_close_waits_for_the_close() -> None:
    import subprocess
    import sys

    code = (
        "import os, signal, time\n"
        "from paratrain.trackers import _sigterm_after\n"
        "with _sigterm_after():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.2)\n"
        "    print('closed', flush=True)\n"
        "print('after', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "closed\n" and done.returncode == -15, (done.stdout, done.stderr)


CRASHES_BEFORE_ITS_FIRST_SAVE = """
import os, sys
from pathlib import Path
import paratrain as pt
from tests.trackers import training

def killed(self, *args, **kwargs):  # as a SIGKILL: no close, the MLflow run stays RUNNING
    os._exit(9)

pt.Run.save = killed
training.train(
    Path(sys.argv[1]), steps=6, save_at=3, attempt=0,
    log_to=["tensorboard", "mlflow", "wandb"], mlflow_tracking_uri=sys.argv[2],
)
"""


def test_a_restart_before_the_first_save_continues_the_tracker_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import subprocess
    import sys

    uri = (tmp_path / "store").as_uri()
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)  # no launcher id: the job generates its own
    command = [sys.executable, "-c", CRASHES_BEFORE_ITS_FIRST_SAVE, str(tmp_path), uri]
    # Not this process's wandb service (WANDB_SERVICE): the killed attempt's runs would stay in use.
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    root = Path(__file__).resolve().parents[2]  # `python -c` imports tests.* from its cwd
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=root)
    assert done.returncode == 9, done.stderr[-3000:]
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # torchrun restarted the job
    second = train(tmp_path, steps=4, attempt=1, log_to=ALL, mlflow_tracking_uri=uri)

    client = mlflow_client(uri)
    (run,) = client.search_runs([second["mlflow"]["experiment_id"]])  # no orphan beside it
    assert run.info.run_id == second["mlflow"]["run_id"] and run.info.status == "FINISHED"
    shown = tensorboard_scalars(tmp_path / "tensorboard", "attempt")
    assert shown == [(s, 1.0) for s in (1, 2, 3, 4)]  # each step once, from the restart
    old, new = wandb_runs(tmp_path)
    assert old.id == new.id
