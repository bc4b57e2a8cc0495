"""Not restart-safe (copy of safe_plateau.py): ``ReduceLROnPlateau`` is stepped by hand but never
registered (not given to ``run.setup``), so no checkpoint holds its best value and patience
counter.

A resumed scheduler starts from ``best = inf`` with no bad epochs: it halves the learning rate
at other epochs than in the uninterrupted run. Expected first difference: the model's weights
(``rank 0/models/model/0.weight``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 3, generator=g)
    x_train, x_val = torch.randn(24, 6, generator=g), torch.randn(24, 6, generator=g)
    y_train = (x_train @ w + 1.5 * torch.randn(24, 3, generator=g)).argmax(1)
    y_val = (x_val @ w + 1.5 * torch.randn(24, 3, generator=g)).argmax(1)
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.Adam(net.parameters(), lr=2e-2)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, factor=0.5, patience=1, threshold=0.05, threshold_mode="abs"
    )
    model, optimizer = run.setup(net, optimizer)
    loader = run.loader(TensorDataset(x_train, y_train), batch_size=4)
    evaluation = run.eval_loader(TensorDataset(x_val, y_val), batch_size=8)
    run.resume()
    for epoch in run.epochs(6):
        model.train()
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
        model.eval()
        with torch.no_grad():
            total = sum(
                float(nn.functional.cross_entropy(model(x), y, reduction="sum"))
                for x, y in evaluation
            )
        val = run.reduce(total, "sum") / len(y_val)
        plateau.step(val)
        run.print(f"epoch {epoch}: val {val:.4f} lr {optimizer.param_groups[0]['lr']:.4g}")
        run.save()
    run.close()


if __name__ == "__main__":
    main()
