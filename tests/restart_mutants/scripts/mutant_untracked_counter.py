"""Not restart-safe (copy of safe_tracked_counter.py): the samples seen so far, which drive the
label smoothing, are counted in a plain variable that no checkpoint holds.

After a resume the count starts again from 0 while the weights continue from the checkpoint, so
the label smoothing, then the loss and the weights, leave the uninterrupted run's path.
Expected first difference: the model's weights (``rank 0/models/model/0.weight``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.Adam(net.parameters(), lr=1e-2))
    seen = 0
    loader = run.loader(train, batch_size=4)
    run.resume()
    for _ in run.epochs(3):
        for x, y in loader:
            smoothing = max(0.0, 0.3 - seen / 200)
            loss = nn.functional.cross_entropy(model(x), y, label_smoothing=smoothing)
            run.backward(loss)
            if run.step(optimizer):
                seen += len(x)
        run.save()
    run.close()


if __name__ == "__main__":
    main()
