"""No ``run.resume()`` call: ``with pt.Run(...) as run:`` and the automatic resume after a
restart (at the first training action, or reading ``run.extras``); the running sum of the
training loss travels in the extras, read back once through ``run.extras`` before the loop; a
save at the end of every epoch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    with pt.Run(progress=False, timeout_s=30) as run:
        net = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
        model, optimizer = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
        loader = run.loader(train, batch_size=4)
        loss_sum = run.extras.get("loss_sum", 0.0)  # after a restart, this resumes first
        for epoch in run.epochs(3):
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                run.backward(loss)
                run.step(optimizer)
                loss_sum += loss.item()
            run.print(f"epoch {epoch}: loss sum {loss_sum:.4f}")
            run.save(extras={"loss_sum": loss_sum})


if __name__ == "__main__":
    main()
