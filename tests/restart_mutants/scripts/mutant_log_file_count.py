"""Not restart-safe (copy of safe_several_saves.py): every step appends a line to a log file in the
run dir, and the learning rate decays with the number of lines in it, not with
``run.global_step``.

The file is not part of any checkpoint: after a kill it still holds the lines of the steps the
killed process took after its last save, so the resumed run counts those steps twice and decays
faster. Expected first difference: the model's weights (``rank 0/models/model/0.weight``).
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
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    loader = run.loader(train, batch_size=4)
    log = run.run_dir / f"steps-rank{run.rank}.log"
    run.resume()
    for _ in run.epochs(3):
        for x, y in loader:
            done = len(log.read_text().splitlines()) if log.exists() else 0
            for group in optimizer.param_groups:
                group["lr"] = 0.1 / (1 + 0.1 * done)
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer)
            with log.open("a") as f:
                f.write(f"step {run.global_step}\n")
            if run.global_step % 3 == 0:
                run.save()
        run.save()
    run.close()


if __name__ == "__main__":
    main()
