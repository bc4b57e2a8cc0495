"""A counter object registered with ``run.track``: the samples seen so far drive the label
smoothing (a curriculum that anneals it away); a save at the end of every epoch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


class SampleCounter:
    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = int(state["seen"])


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.Adam(net.parameters(), lr=1e-2))
    counter = run.track(SampleCounter(), name="samples")
    loader = run.loader(train, batch_size=4)
    run.resume()
    for _ in run.epochs(3):
        for x, y in loader:
            smoothing = max(0.0, 0.3 - counter.seen / 200)
            loss = nn.functional.cross_entropy(model(x), y, label_smoothing=smoothing)
            run.backward(loss)
            if run.step(optimizer):
                counter.seen += len(x)
        run.save()
    run.close()


if __name__ == "__main__":
    main()
