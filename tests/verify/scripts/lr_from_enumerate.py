"""Safe against a SIGKILL, not against preemption: the learning rate comes from the index of
``enumerate(loader)``, which counts from 0 again when a run resumes in the middle of an epoch.
Saves only at the end of each epoch, so a SIGKILL always resumes at an epoch's start; a
preemption saves mid-epoch.

    paratrain verify-resume tests/verify/scripts/lr_from_enumerate.py    # the preempt kill differs
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
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    loader = run.loader(data, batch_size=8)
    run.resume()
    for _ in run.epochs(3):
        for i, (x, y) in enumerate(loader):
            for group in optimizer.param_groups:
                group["lr"] = 0.1 / (1 + i)  # the defect: i restarts at 0 after a resume
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
        run.save()
    run.close()


if __name__ == "__main__":
    main()
