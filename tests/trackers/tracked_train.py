"""A 2-rank script that logs to every tracker, run by tests/trackers/test_end_to_end.py:

    WANDB_MODE=offline paratrain run --nproc 2 --max-restarts 1 --run-dir OUT \
        tests/trackers/tracked_train.py --kill-step 5

It saves every 3 steps; with ``--kill-step`` rank 1 SIGKILLs itself at that step of the first
attempt, torchrun restarts both ranks, and the run resumes from the last save on its own.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-step", type=int, default=-1)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    with pt.Run(
        strategy="ddp",
        progress=False,
        timeout_s=60,
        stats_every=None,
        log_to=["tensorboard", "mlflow", "wandb"],
        extra={"lr": 0.05, "script": "tracked_train"},
    ) as run:
        net = nn.Linear(4, 1)
        model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.05))
        loader = run.loader(data, batch_size=8)
        for _ in run.epochs(2):
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x), y)
                run.backward(loss)
                run.step(optimizer)
                mean = run.reduce(loss.detach(), "mean")
                run.log({"loss": float(mean), "attempt": run.restart_count})
                if run.global_step % 3 == 0:
                    run.save()
                first_attempt = run.restart_count == 0
                if first_attempt and run.rank == 1 and run.global_step == args.kill_step:
                    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
