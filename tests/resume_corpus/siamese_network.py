"""pytorch/examples ``siamese_network/main.py``, ported to paratrain (generated 8x8 digits).

    python siamese_network.py [--epochs 3]
    paratrain run --nproc 2 siamese_network.py

Shape: a dataset whose ``__getitem__`` picks its pairs with Python's ``random`` module (the index
only says same class or not), for training and test alike; one tower applied to both inputs
(``forward_once``), the two embeddings concatenated into a sigmoid head with ``BCELoss``;
``init_weights`` applied to the head; Adadelta with a ``StepLR`` stepped once per epoch;
``siamese_network.pt`` written at the end as the original's ``--save-model`` does; a save every
epoch.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import Dataset

import paratrain as pt


class APP_MATCHER(Dataset):
    """Pairs of generated 8x8 digits: even indices the same class, odd ones different classes."""

    def __init__(self, train: bool) -> None:
        g = torch.Generator().manual_seed(0)
        y = torch.arange(420) % 10
        x = torch.rand(10, 1, 8, 8, generator=g)[y] + 0.5 * torch.randn(420, 1, 8, 8, generator=g)
        part = slice(0, 320) if train else slice(320, 420)
        self.data, self.targets = x[part], y[part]
        self.grouped_examples = {i: np.where(self.targets.numpy() == i)[0] for i in range(10)}

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, index: int):
        selected_class = random.randint(0, 9)
        group = self.grouped_examples[selected_class]
        random_index_1 = random.randint(0, group.shape[0] - 1)
        image_1 = self.data[group[random_index_1]].clone()
        if index % 2 == 0:
            random_index_2 = random.randint(0, group.shape[0] - 1)
            while random_index_2 == random_index_1:
                random_index_2 = random.randint(0, group.shape[0] - 1)
            image_2 = self.data[group[random_index_2]].clone()
            target = torch.tensor(1, dtype=torch.float)
        else:
            other_selected_class = random.randint(0, 9)
            while other_selected_class == selected_class:
                other_selected_class = random.randint(0, 9)
            other = self.grouped_examples[other_selected_class]
            image_2 = self.data[other[random.randint(0, other.shape[0] - 1)]].clone()
            target = torch.tensor(0, dtype=torch.float)
        return image_1, image_2, target


class SiameseNetwork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tower = nn.Sequential(
            nn.Conv2d(1, 8, 3),
            nn.ReLU(inplace=True),
            nn.Conv2d(8, 16, 3),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.fc = nn.Sequential(nn.Linear(32, 16), nn.ReLU(inplace=True), nn.Linear(16, 1))
        self.sigmoid = nn.Sigmoid()
        self.fc.apply(self.init_weights)

    def init_weights(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            torch.nn.init.xavier_uniform_(m.weight)
            m.bias.data.fill_(0.01)

    def forward_once(self, x):
        output = self.tower(x)
        return output.view(output.size()[0], -1)

    def forward(self, input1, input2):
        output = torch.cat((self.forward_once(input1), self.forward_once(input2)), 1)
        return self.sigmoid(self.fc(output))


def train(args, run, model, train_loader, optimizer, epoch):
    model.train()
    criterion = nn.BCELoss()
    for batch_idx, (images_1, images_2, targets) in enumerate(train_loader):
        with run.accumulate(model):
            outputs = model(images_1, images_2).squeeze()
            loss = criterion(outputs, targets)
            run.backward(loss)
        run.step(optimizer)
        if batch_idx % args.log_interval == 0:
            run.print(
                f"Train Epoch: {epoch} [{batch_idx * len(images_1)}/{len(train_loader.dataset)}]"
                f"\tLoss: {loss.item():.6f}"
            )


def test(run, model, test_loader):
    model.eval()
    test_loss = 0.0
    correct = 0
    criterion = nn.BCELoss()
    with torch.no_grad():
        for images_1, images_2, targets in test_loader:
            outputs = model(images_1, images_2).squeeze()
            test_loss += criterion(outputs, targets).sum().item()
            pred = torch.where(outputs > 0.5, 1, 0)
            correct += pred.eq(targets.view_as(pred)).sum().item()
    test_loss = run.reduce(test_loss, "sum") / len(test_loader.dataset)
    correct = run.reduce(correct, "sum")
    run.print(
        f"Test set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{len(test_loader.dataset)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="siamese_network-shaped example")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--test-batch-size", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=5)
    args = parser.parse_args()

    run = pt.Run(seed=args.seed, progress=False)
    train_loader = run.loader(APP_MATCHER(train=True), batch_size=args.batch_size)
    test_loader = run.eval_loader(APP_MATCHER(train=False), batch_size=args.test_batch_size)
    model = SiameseNetwork()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    model, optimizer = run.setup(model, optimizer, scheduler=scheduler)
    for epoch in run.epochs(args.epochs):
        train(args, run, model, train_loader, optimizer, epoch)
        test(run, model, test_loader)
        scheduler.step()
        run.save()
    run.save_weights(model, run.run_dir / "siamese_network.pt")
    run.close()


if __name__ == "__main__":
    main()
