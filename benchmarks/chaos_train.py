"""The training job of the chaos test: 2 DDP ranks, a checkpoint every 2 steps, one rank killed.

    paratrain run --nproc 2 --max-restarts 3 --run-dir D benchmarks/chaos_train.py \
        --kill-rank 1 --kill-step 7

On the first start (TORCHELASTIC_RESTART_COUNT=0) the chosen rank SIGKILLs itself right after
the chosen step; the restarted workers resume from the newest checkpoint. Rank 0 writes the
final weights to D/final.pt.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-step", type=int, default=-1)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g))
    with pt.Run(strategy="ddp", progress=False, keep_last=2, timeout_s=20) as run:
        net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 3))
        model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
        loader = run.loader(data, batch_size=4)
        for _ in run.epochs(3):  # resumes by itself after a restart
            for x, y in loader:
                with run.accumulate(model):
                    run.backward(nn.functional.cross_entropy(model(x), y))
                run.step(opt)
                if run.global_step % 2 == 0:
                    run.save()
                if (
                    run.restart_count == 0
                    and run.rank == args.kill_rank
                    and run.global_step == args.kill_step
                ):
                    sys.stdout.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
        run.save_weights(model, run.run_dir / "final.pt")


if __name__ == "__main__":
    main()
