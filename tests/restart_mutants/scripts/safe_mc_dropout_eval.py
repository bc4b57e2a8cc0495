"""Monte Carlo dropout evaluation: at the end of every epoch the model is evaluated with dropout
on (``model.train()`` under ``torch.no_grad()``, several samples per batch: random draws from
the global generator), before the save, so the checkpoint holds the generators after them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    test = TensorDataset(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
    model, optimizer = run.setup(net, torch.optim.Adam(net.parameters(), lr=1e-2))
    loader = run.loader(train, batch_size=6)
    evaluation = run.eval_loader(test, batch_size=8)
    run.resume()
    for epoch in run.epochs(3):
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
        with torch.no_grad():  # dropout stays on: the spread of 4 samples is the uncertainty
            spread = sum(
                float(torch.stack([model(x).softmax(1) for _ in range(4)]).std(0).mean())
                for x, _ in evaluation
            )
        run.print(f"epoch {epoch}: uncertainty {spread:.4f}")
        run.save()
    run.close()


if __name__ == "__main__":
    main()
