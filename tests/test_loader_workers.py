"""Loader workers: how many a run chooses, and that a closed run's workers leave no noise."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import gc, sys
    import torch
    import paratrain as pt
    from torch.utils.data import TensorDataset

    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    kept = []

    def job():
        run = pt.Run(strategy="cpu", progress=False, stats_every=None, num_workers=2,
                     run_dir=sys.argv[1])
        model = torch.nn.Linear(4, 1)
        model, opt = run.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        # Each worker collects garbage as it starts: a copy of an earlier run's worker
        # iterator, inherited by the fork, would be deleted there.
        loader = run.loader(data, batch_size=8, worker_init_fn=lambda i: gc.collect())
        for epoch in run.epochs(2):
            for x, y in loader:
                run.backward(torch.nn.functional.mse_loss(model(x), y))
                run.step(opt)
        run.close()
        kept.append((run, loader))

    gc.disable()  # the first run's loader is garbage, not yet collected, when the second forks
    job()
    kept.clear()
    job()
    print("finished")
    """
)


def test_a_second_run_in_one_process_prints_no_worker_noise(tmp_path: Path) -> None:
    script = tmp_path / "two_runs.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "finished" in done.stdout
    assert "Exception ignored" not in done.stderr, done.stderr
    assert "can only test a child process" not in done.stderr


def test_workers_by_device_and_dataset_kind() -> None:
    import torch
    from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset

    from paratrain.data.build import default_workers

    class Files(Dataset[int]):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> int:
            return i

    tensors = TensorDataset(torch.zeros(4, 2))
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert default_workers(cpu, 1, Files())[0] == 0
    for in_memory in (tensors, Subset(tensors, [0, 1]), ConcatDataset([tensors, tensors])):
        workers, why = default_workers(gpu, 1, in_memory)
        assert workers == 0 and "in memory" in why
    workers, why = default_workers(gpu, 1, ConcatDataset([tensors, Files()]))
    assert workers == min(4, max(0, (os.cpu_count() or 1) - 1)) and "cores per rank" in why
