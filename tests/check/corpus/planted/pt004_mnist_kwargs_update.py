"""MNIST example turned distributed: DataLoader arguments are assembled in dicts, as in the upstream example.

Planted: PT004 - cuda_kwargs with 'shuffle': True is merged into train_kwargs, and that loader also gets sampler=.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torchvision import datasets, transforms


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return F.log_softmax(self.fc2(F.relu(self.fc1(torch.flatten(x, 1)))), dim=1)


def train(model, device, train_loader, optimizer):
    model.train()
    for data, target in train_loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()


def test(model, device, test_loader):
    model.eval()
    sums = torch.zeros(3, device=device)
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            sums[0] += F.nll_loss(output, target, reduction="sum")
            sums[1] += output.argmax(dim=1).eq(target).sum()
            sums[2] += target.size(0)
    dist.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--save-model", action="store_true")
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    dataset1 = datasets.MNIST("../data", train=True, download=False, transform=transform)
    dataset2 = datasets.MNIST("../data", train=False, transform=transform)
    sampler1 = torch.utils.data.distributed.DistributedSampler(dataset1)
    sampler2 = torch.utils.data.distributed.DistributedSampler(dataset2, shuffle=False)

    train_kwargs = {"batch_size": args.batch_size}
    test_kwargs = {"batch_size": args.test_batch_size, "num_workers": 1, "pin_memory": True}
    cuda_kwargs = {"num_workers": 1, "pin_memory": True, "shuffle": True}
    train_kwargs.update(cuda_kwargs)
    train_loader = torch.utils.data.DataLoader(dataset1, sampler=sampler1, **train_kwargs)  # planted: PT004
    test_loader = torch.utils.data.DataLoader(dataset2, sampler=sampler2, **test_kwargs)

    model = nn.parallel.DistributedDataParallel(Net().to(device), device_ids=[local_rank])
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(1, args.epochs + 1):
        sampler1.set_epoch(epoch)
        train(model, device, train_loader, optimizer)
        test_loss, accuracy = test(model, device, test_loader)
        scheduler.step()
        if dist.get_rank() == 0:
            print(f"Test set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * accuracy:.0f}%")

    if args.save_model and dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "mnist_cnn.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
