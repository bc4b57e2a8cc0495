"""Not restart-safe at 2 ranks (copy of safe_full_batch.py): the best loss is a per-rank value, but
the checkpoint's extras get rank 0's (``run.gather(best)[0]``), so every rank resumes with rank
0's best.

After a resume rank 1 compares its losses with rank 0's best instead of its own, so it weighs
other steps by half; the gradients are averaged over the ranks, so every rank's weights leave
the uninterrupted path. At 1 rank it is safe. Expected first difference: the model's weights
(``rank 0/models/model/0.weight``).
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
            run.save(extras={"best": run.gather(best)[0]})
    run.close()


if __name__ == "__main__":
    main()
