"""Not restart-safe (copy of safe_mean_teacher.py): the EMA teacher (``AveragedModel``) is not
registered with ``run.track``, so no checkpoint holds it.

A resumed process starts its teacher again from the initial weights, with no average yet (the
next update copies the student), so the consistency targets, then the student's weights, leave
the uninterrupted path. Expected first difference: the model's weights
(``rank 0/models/model/0.weight``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.Adam(net.parameters(), lr=1e-2))
    teacher = AveragedModel(run.unwrap(model), multi_avg_fn=get_ema_multi_avg_fn(0.8))
    loader = run.loader(train, batch_size=4)
    run.resume()
    for _ in run.epochs(3):
        for x, y in loader:
            noisy = x + 0.1 * torch.randn_like(x)
            with torch.no_grad():
                target = teacher(noisy).softmax(1)
            consistency = nn.functional.mse_loss(model(noisy).softmax(1), target)
            run.backward(nn.functional.cross_entropy(model(x), y) + 2.0 * consistency)
            if run.step(optimizer):
                teacher.update_parameters(run.unwrap(model))
        run.save()
    run.close()


if __name__ == "__main__":
    main()
