"""Not restart-safe (copy of safe_dropout_batchnorm.py): the inputs are augmented with noise from
``np.random.default_rng(0)``, a numpy generator made by the script, which no checkpoint holds
(paratrain saves numpy's global generator, not the script's own instances).

After a resume the generator starts again from its seed and the resumed steps see other noise.
Expected first difference: the model's weights (``rank 0/models/model/0.weight``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    test = TensorDataset(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(
        nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3)
    )
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    loader = run.loader(train, batch_size=6)
    evaluation = run.eval_loader(test, batch_size=8)
    noise = np.random.default_rng(0)
    run.resume()
    for epoch in run.epochs(3):
        model.train()
        for x, y in loader:
            x = x + torch.from_numpy(noise.normal(0, 0.1, tuple(x.shape))).float()
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
            if run.global_step % 3 == 0:
                run.save()
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in evaluation)
        run.print(f"epoch {epoch}: accuracy {run.reduce(correct, 'sum') / len(test):.3f}")
        run.save()
    run.close()


if __name__ == "__main__":
    main()
