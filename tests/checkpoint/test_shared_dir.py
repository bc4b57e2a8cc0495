"""Two jobs sharing a ``ckpt_dir``: a save removes only leftovers of saves that no longer run,
never another job's save in progress."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

import paratrain as pt
from paratrain.checkpoint.store import _HOST
from tests.support.training import mlp


def test_a_save_keeps_another_live_jobs_save_in_progress(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    live = ckpts / f".tmp-step-00000001-{_HOST}-{other.pid}-1"
    dead = ckpts / f".tmp-step-00000001-{_HOST}-{int(gone.stdout)}-2"
    doomed = ckpts / ".tmp-deleting-step-00000000-3"
    for folder in (live, dead, doomed):
        folder.mkdir()
    try:
        with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False) as run:
            model = mlp()
            run.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
            run.save()
        assert live.is_dir()
        assert not dead.exists() and not doomed.exists()
    finally:
        other.kill()
        other.wait()
