"""Not restart-safe (copy of safe_two_loaders.py): the unlabelled batches come from a plain
``torch.utils.data.DataLoader`` instead of ``run.loader``, so no checkpoint holds its position.

The saves fall mid-epoch; after such a resume the plain loader starts a new pass (a new shuffle)
while the uninterrupted run was in the middle of one, so the entropy term sees other batches.
Expected first difference: the model's weights (``rank 0/models/model/0.weight``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    labelled = TensorDataset(
        torch.randn(36, 6, generator=g), torch.randint(0, 3, (36,), generator=g)
    )
    unlabelled = TensorDataset(torch.randn(40, 6, generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.Adam(net.parameters(), lr=1e-2))
    labelled_loader = run.loader(labelled, batch_size=4)
    unlabelled_loader = DataLoader(unlabelled, batch_size=4, shuffle=True)
    run.resume()
    for _ in run.epochs(3):
        for (x, y), (u,) in zip(labelled_loader, unlabelled_loader, strict=False):
            p = model(u).softmax(1)
            entropy = -(p * p.clamp_min(1e-8).log()).sum(1).mean()
            run.backward(nn.functional.cross_entropy(model(x), y) + 0.1 * entropy)
            run.step(optimizer)
            if run.global_step % 4 == 0:
                run.save()
        run.save()
    run.close()


if __name__ == "__main__":
    main()
