"""A per-rank statistic registered with ``run.track``: each rank normalises its loss by the
running mean of its own losses (each rank's value differs, and each resumes with its own);
saves every 3 steps and at the end of every epoch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


class RunningMean:
    def __init__(self, momentum: float = 0.8) -> None:
        self.momentum, self.value = momentum, 1.0

    def update(self, x: float) -> float:
        self.value = self.momentum * self.value + (1 - self.momentum) * x
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.2))
    loss_mean = run.track(RunningMean(), name="loss_mean")
    loader = run.loader(train, batch_size=4)
    run.resume()
    for _ in run.epochs(3):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            run.backward(loss / loss_mean.update(loss.item()))
            run.step(optimizer)
            if run.global_step % 3 == 0:
                run.save()
        run.save()
    run.close()


if __name__ == "__main__":
    main()
