"""An EMA of the weights: ``torch.optim.swa_utils.AveragedModel`` registered with ``run.track``,
updated after every optimizer step and evaluated at the end of every epoch, before the save.
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
    test = TensorDataset(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
    ema = AveragedModel(run.unwrap(model), multi_avg_fn=get_ema_multi_avg_fn(0.9))
    run.track(ema, name="ema")
    loader = run.loader(train, batch_size=4)
    evaluation = run.eval_loader(test, batch_size=8)
    run.resume()
    for epoch in run.epochs(3):
        for x, y in loader:
            run.backward(nn.functional.cross_entropy(model(x), y))
            if run.step(optimizer):
                ema.update_parameters(run.unwrap(model))
        with torch.no_grad():
            correct = sum(int((ema(x).argmax(1) == y).sum()) for x, y in evaluation)
        run.print(f"epoch {epoch}: EMA accuracy {run.reduce(correct, 'sum') / len(test):.3f}")
        run.save()
    run.close()


if __name__ == "__main__":
    main()
