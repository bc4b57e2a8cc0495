"""Full-batch training in a ``while`` loop: each rank reads its share of the data once, with
``next(iter(run.loader(...)))``; a step whose loss is above this rank's best so far counts half,
and the best (a per-rank value) travels in the checkpoint's extras, restored from
``run.resume()``'s return.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.3), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.Adam(net.parameters(), lr=5e-2))
    x, y = next(iter(run.loader(data, batch_size=len(data) // run.world_size)))
    best = (run.resume() or {}).get("best", float("inf"))
    while run.global_step < 24:
        loss = nn.functional.cross_entropy(model(x), y)
        weight = 1.0 if loss.item() <= best else 0.5
        best = min(best, loss.item())  # this rank's own
        run.backward(weight * loss)
        run.step(optimizer)
        if run.global_step % 4 == 0:
            run.save(extras={"best": best})
    run.close()


if __name__ == "__main__":
    main()
