"""A README-shaped loop for the preemption tests: saves only at the end of each epoch, never
calls run.resume() (a checkpoint saved on preemption is resumed all the same).

    python job.py RUN_DIR [--sleep S] [--epochs N] [--samples N] [--grace S] [--slow-save S]
                          [--no-signals]

Rank 0 writes RUN_DIR/started once 3 steps are done; the final weights go to RUN_DIR/final.pt.
A rerun is the same command (a preempted checkpoint resumes by itself only for that); ``--sleep``
slows the first attempt only.
"""

import argparse
import time
from pathlib import Path

import torch
from torch import nn

import paratrain as pt

parser = argparse.ArgumentParser()
parser.add_argument("run_dir", type=Path)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=256)
parser.add_argument("--grace", type=float, default=25.0)
parser.add_argument("--slow-save", type=float, default=0.0)
parser.add_argument("--no-signals", action="store_true")
args = parser.parse_args()

if args.slow_save:  # a save on preemption that cannot finish within the grace period
    from paratrain.runtime.checkpointer import Checkpointer

    quick = Checkpointer.save_preempted

    def slow(self, signal_name):
        time.sleep(args.slow_save)
        return quick(self, signal_name)

    Checkpointer.save_preempted = slow

signals = None if args.no_signals else ("SIGTERM", "SIGUSR1", "SIGUSR2")
run = pt.Run(
    run_dir=args.run_dir, progress=False, seed=0, stats_every=None,
    preempt_signals=signals, preempt_grace_s=args.grace,
)  # fmt: skip
torch.manual_seed(0)
features, labels = torch.randn(args.samples, 8), torch.randint(0, 3, (args.samples,))
data = torch.utils.data.TensorDataset(features, labels)
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
loader = run.loader(data, batch_size=8, shuffle=True)
for _epoch in run.epochs(args.epochs):
    for x, y in loader:
        run.backward(nn.functional.cross_entropy(model(x), y))
        run.step(opt)
        if run.global_step == 3 and run.is_main:
            (args.run_dir / "started").touch()
        time.sleep(args.sleep if run.resumed_from is None else 0.0)  # a rerun goes at full speed
    run.save()
run.save_weights(model, args.run_dir / "final.pt")
run.close()
