"""pytorch/examples ``mnist/main.py``, ported to paratrain (generated 8x8 digits).

    python mnist.py [--epochs 3]
    paratrain run --nproc 2 mnist.py

Shape: a per-epoch ``train()``/``test()`` pair, dropout in the model, Adadelta with a ``StepLR``
stepped once per epoch, a log line that reads ``len(train_loader.dataset)`` and
``len(train_loader)``, summed test loss over ``len(test_loader.dataset)``, a save every epoch.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import TensorDataset

import paratrain as pt


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
        return F.log_softmax(self.fc2(x), dim=1)


def digits(train: bool) -> TensorDataset:
    """Ten noisy 8x8 patterns, the same in every process (MNIST would need a download)."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(420) % 10
    x = torch.rand(10, 1, 8, 8, generator=g)[y] + 0.5 * torch.randn(420, 1, 8, 8, generator=g)
    part = slice(0, 320) if train else slice(320, 420)
    return TensorDataset(x[part], y[part])


def train(args, run, model, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        with run.accumulate(model):
            loss = F.nll_loss(model(data), target)
            run.backward(loss)
        run.step(optimizer)
        if batch_idx % args.log_interval == 0:
            run.print(
                f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)} "
                f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}"
            )


def test(run, model, test_loader):
    model.eval()
    test_loss = 0.0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss = run.reduce(test_loss, "sum") / len(test_loader.dataset)
    correct = run.reduce(correct, "sum")
    run.print(
        f"Test set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{len(test_loader.dataset)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="mnist-shaped example")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--test-batch-size", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=5)
    args = parser.parse_args()

    run = pt.Run(seed=args.seed, progress=False)
    train_loader = run.loader(digits(train=True), batch_size=args.batch_size)
    test_loader = run.eval_loader(digits(train=False), batch_size=args.test_batch_size)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    model, optimizer = run.setup(model, optimizer, scheduler=scheduler)
    for epoch in run.epochs(args.epochs):
        train(args, run, model, train_loader, optimizer, epoch)
        test(run, model, test_loader)
        scheduler.step()
        run.save()
    run.close()


if __name__ == "__main__":
    main()
