"""An elastic job's loop for tests/elastic: a global batch of 16 kept whatever the world size,
a checkpoint every 2 steps, and every micro-batch's sample ids written down.

    paratrain run --nnodes 1:2 --nproc 1 --max-restarts 3 --rdzv-endpoint HOST:PORT \\
        job.py RUN_DIR
    python job.py RUN_DIR --grad-accum 2          # the uninterrupted reference, one process

Each rank appends ``{"attempt", "rank", "epoch", "step", "ids"}`` lines to
``RUN_DIR/samples/rank<r>-attempt<a>.jsonl``; rank 0 writes ``RUN_DIR/at-step-<n>`` as it passes
steps 4 and 6, and the final weights to ``RUN_DIR/final.pt``.
"""

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

import paratrain as pt


class Numbered(Dataset):
    """Random features and labels, each item with its index."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


parser = argparse.ArgumentParser()
parser.add_argument("run_dir", type=Path)
parser.add_argument("--grad-accum", type=int, default=1)
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()

run = pt.Run(
    run_dir=args.run_dir, progress=False, seed=0, stats_every=None, grad_accum=args.grad_accum
)
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
loader = run.loader(Numbered(128), batch_size=8, shuffle=True)
log = args.run_dir / "samples" / f"rank{run.rank}-attempt{run.restart_count}.jsonl"
log.parent.mkdir(parents=True, exist_ok=True)
run.resume()
for epoch in run.epochs(3):
    for x, y, ids in loader:
        with log.open("a") as f:
            record = {"attempt": run.restart_count, "rank": run.rank, "epoch": epoch,
                      "step": run.global_step, "ids": ids.tolist()}  # fmt: skip
            f.write(json.dumps(record) + "\n")
        with run.accumulate(model):
            run.backward(nn.functional.cross_entropy(model(x), y))
        if run.step(opt):
            if run.global_step % 2 == 0:
                run.save()
            if run.is_main and run.global_step in (4, 6):
                (args.run_dir / f"at-step-{run.global_step}").touch()
        time.sleep(args.sleep)
run.save_weights(model, args.run_dir / "final.pt")
run.close()
