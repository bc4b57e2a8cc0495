"""MNIST convnet on several GPUs with DistributedDataParallel, launched by torchrun.

Planted: PT023 - every loss.backward() runs inside `with model.no_sync():`, so DDP never all-reduces gradients
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def train(model, device, loader, optimizer, epoch, rank, log_interval):
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        with model.no_sync():  # planted: PT023
            loss.backward()
        optimizer.step()
        if batch_idx % log_interval == 0 and rank == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.sampler)}]\tLoss: {loss.item():.6f}")


def test(model, device, loader):
    model.eval()
    sums = torch.zeros(3, device=device)
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            sums[0] += F.nll_loss(output, target, reduction="sum")
            sums[1] += (output.argmax(dim=1) == target).sum()
            sums[2] += target.numel()
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST DDP")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_ds = datasets.MNIST("../data", train=True, download=False, transform=transform)
    test_ds = datasets.MNIST("../data", train=False, transform=transform)
    train_sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_ds, batch_size=1000, sampler=DistributedSampler(test_ds, shuffle=False))

    model = DDP(Net().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        train(model, device, train_loader, optimizer, epoch, rank, args.log_interval)
        test_loss, acc = test(model, device, test_loader)
        scheduler.step()
        if rank == 0:
            print(f"Test set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * acc:.2f}%")

    if rank == 0:
        torch.save(model.module.state_dict(), "mnist_cnn.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
