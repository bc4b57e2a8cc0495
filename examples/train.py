"""A small real training job: an MLP on generated data, a checkpoint after every epoch.

    python examples/train.py --epochs 3                      # one process (CPU, or one GPU)
    paratrain run --nproc 2 examples/train.py --epochs 3     # 2 ranks (DDP; gloo on CPU)
    paratrain run --nproc 4 --max-restarts 3 --run-dir runs/exp examples/train.py
    sbatch examples/slurm.sbatch                             # 2 nodes x 4 GPUs

Started again with the same run dir, it continues from the newest checkpoint; after a restart
(``--max-restarts``) the ranks resume by themselves.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def dataset(samples: int, seed: int = 0) -> TensorDataset:
    """Points in 16 dimensions, labelled by which of 4 fixed directions they lean towards."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 16, generator=g)
    return TensorDataset(x, (x @ torch.randn(16, 4, generator=g)).argmax(dim=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--batch-size", type=int, default=64, help="per-rank batch")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--run-dir", default=None, help="default: paratrain run's, or runs/paratrain")
    args = p.parse_args()
    with pt.Run(grad_accum=args.grad_accum, run_dir=args.run_dir) as run:
        net = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 4))
        model, optimizer = run.setup(net, torch.optim.AdamW(net.parameters(), lr=args.lr))
        loader = run.loader(dataset(args.samples), batch_size=args.batch_size, shuffle=True)
        if run.resume() is not None:
            run.print(f"resumed from {run.resumed_from} at epoch {run.epoch}")
        for epoch in run.epochs(args.epochs):
            for x, y in run.progress(loader, desc=f"epoch {epoch}"):
                with run.accumulate(model):
                    loss = nn.functional.cross_entropy(model(x), y)
                    run.backward(loss)
                run.step(optimizer)
            run.save()  # every rank calls it; the run dir keeps the newest checkpoints
            mean_loss = run.reduce(loss.detach(), "mean").item()
            run.log({"loss": mean_loss})
            run.print(f"epoch {epoch}: loss {mean_loss:.4f}, step {run.global_step}")
        run.save_weights(model, run.run_dir / "model.pt")


if __name__ == "__main__":
    main()
