"""Not restart-safe (copy of safe_grad_accum.py): the accumulation is done by hand, counting
micro-batches in a plain variable and stepping every second one, instead of
``Run(grad_accum=2)`` with ``run.accumulate``; windows run across epoch ends.

An epoch has an odd number of micro-batches, so the save at its end falls in the middle of a
window: the gradients already accumulated are in no checkpoint, and after a resume the count
starts from 0 again, so the windows pair other micro-batches. Expected first difference: the
model's weights (``rank 0/models/model/0.weight``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9))
    loader = run.loader(train, batch_size=8)
    micro_batches = 0
    run.resume()
    for _ in run.epochs(4):
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(model(x), y) / 2)
            micro_batches += 1
            if micro_batches % 2 == 0:
                run.step(optimizer)
        run.save()
    run.close()


if __name__ == "__main__":
    main()
