"""A small restart-safe script in the README's loop shape: grad_accum 2, a save every epoch,
an evaluation pass every epoch (every kill point of ``paratrain verify-resume`` occurs), and the
best weights so far in ``run_dir/best.pt`` (the best accuracy travels in the checkpoint's extras).

    paratrain verify-resume --nproc 2 --compare-files best.pt tests/verify/scripts/restart_safe.py
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    test = TensorDataset(torch.randn(20, 6, generator=g), torch.randint(0, 3, (20,), generator=g))
    run = pt.Run(grad_accum=2, progress=False, timeout_s=30)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 3))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    model, optimizer = run.setup(net, optimizer, scheduler=scheduler)
    loader = run.loader(train, batch_size=4)
    evaluation = run.eval_loader(test, batch_size=4)
    best = run.extras.get("best", -1.0)  # resumes first after a restart
    for epoch in run.epochs(args.epochs):
        model.train()
        for x, y in loader:
            with run.accumulate(model):
                run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(optimizer, scheduler)
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in evaluation)
        accuracy = run.reduce(correct, "sum") / len(test)
        if accuracy > best:
            best = accuracy
            run.save_weights(model, run.run_dir / "best.pt")
        run.save(extras={"best": best, "epoch": epoch})
        run.print(f"epoch {epoch}: accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
