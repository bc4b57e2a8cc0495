"""Not restart-safe (copy of safe_epochs_scheduler.py): the weights are initialised by hand after
``run.resume()`` instead of before ``run.setup``, so a resumed run overwrites the weights it
just restored with fresh ones.

Expected first difference: the model's weights (``rank 0/models/model/0.weight``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(module.bias)


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    test = TensorDataset(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    model, optimizer = run.setup(net, optimizer, scheduler=scheduler)
    loader = run.loader(train, batch_size=6)
    evaluation = run.eval_loader(test, batch_size=8)
    run.resume()
    net.apply(init_weights)
    for epoch in run.epochs(4):
        model.train()
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
        scheduler.step()
        model.eval()
        with torch.no_grad():
            total = sum(
                float(nn.functional.cross_entropy(model(x), y, reduction="sum"))
                for x, y in evaluation
            )
        run.print(f"epoch {epoch}: test loss {run.reduce(total, 'sum') / len(test):.4f}")
        run.save()
    run.close()


if __name__ == "__main__":
    main()
