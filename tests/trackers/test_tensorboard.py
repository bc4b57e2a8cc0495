"""TensorBoard, read back with its own EventAccumulator: scalars at their steps and the
hyper-parameters in the run's own folder (no sub-folder run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trackers.records import tensorboard_hparams, tensorboard_scalars
from tests.trackers.training import train


@pytest.mark.parametrize("settings", [{"tensorboard": True}, {"log_to": ["tensorboard"]}])
def test_scalars_and_hyperparameters_in_run_dir_tensorboard(
    tmp_path: Path, settings: dict[str, object]
) -> None:
    runs = train(tmp_path, steps=3, extra={"lr": 0.25, "note": "baseline"}, **settings)
    log_dir = tmp_path / "tensorboard"
    assert runs["tensorboard"] == {"log_dir": str(log_dir.resolve())}
    assert [step for step, _ in tensorboard_scalars(log_dir, "loss")] == [1, 2, 3]
    assert tensorboard_scalars(log_dir, "attempt") == [(1, 1.0), (2, 1.0), (3, 1.0)]
    hparams = tensorboard_hparams(log_dir)
    assert hparams["extra.lr"] == 0.25 and hparams["extra.note"] == "baseline"
    assert hparams["strategy"] == "cpu" and hparams["tensorboard"] == settings.get(
        "tensorboard", False
    )
    assert [p for p in log_dir.iterdir() if p.is_dir()] == []
