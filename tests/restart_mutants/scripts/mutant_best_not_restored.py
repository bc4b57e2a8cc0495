"""Not restart-safe (copy of safe_early_stopping.py): the best validation loss is saved in the
extras but not read back from ``run.resume()``'s return, so a resumed run starts from
``best = inf``.

The first epoch after a resume always counts as an improvement, which resets the patience: the
run stops later and trains more epochs. Expected first difference: the model's weights
(``rank 0/models/model/0.weight``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt

MAX_EPOCHS = 12
PATIENCE = 3
MIN_DELTA = 0.02


def main() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 3, generator=g)
    x_train, x_val = torch.randn(24, 6, generator=g), torch.randn(24, 6, generator=g)
    y_train = (x_train @ w + 1.5 * torch.randn(24, 3, generator=g)).argmax(1)
    y_val = (x_val @ w + 1.5 * torch.randn(24, 3, generator=g)).argmax(1)
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))
    model, optimizer = run.setup(net, torch.optim.Adam(net.parameters(), lr=2e-2))
    loader = run.loader(TensorDataset(x_train, y_train), batch_size=4)
    evaluation = run.eval_loader(TensorDataset(x_val, y_val), batch_size=8)
    state = run.resume() or {}
    best = float("inf")
    bad_epochs = state.get("bad_epochs", 0)
    for epoch in run.epochs(MAX_EPOCHS):
        if bad_epochs >= PATIENCE:
            run.print(f"early stop at epoch {epoch}")
            break
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
        if val < best - MIN_DELTA:
            best, bad_epochs = val, 0
        else:
            bad_epochs += 1
        run.print(f"epoch {epoch}: val {val:.4f} best {best:.4f} bad {bad_epochs}")
        run.save(extras={"best": best, "bad_epochs": bad_epochs})
    run.close()


if __name__ == "__main__":
    main()
