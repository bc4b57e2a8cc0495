"""One model, two optimizers: SGD with momentum for the body, Adam for the head
(``run.setup(model, body, head)``), both stepped every iteration; a save every epoch.
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
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    body = torch.optim.SGD(net[0].parameters(), lr=0.05, momentum=0.9)
    head = torch.optim.Adam(net[2].parameters(), lr=1e-2)
    model, body, head = run.setup(net, body, head)
    loader = run.loader(train, batch_size=4)
    run.resume()
    for _ in run.epochs(3):
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(body)
            run.step(head)
        run.save()
    run.close()


if __name__ == "__main__":
    main()
