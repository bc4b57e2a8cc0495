"""Fashion-MNIST classifier trained with DistributedDataParallel (torchrun launcher).

Planted: PT016 - the per-step loss print inside the training loop runs on every rank
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms

EPOCHS = 10
BATCH_SIZE = 128
LR = 1e-3


def make_model():
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, 10),
    )


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device(f"cuda:{local_rank}")

    training_data = datasets.FashionMNIST(root="data", train=True, download=False,
                                          transform=transforms.ToTensor())
    sampler = DistributedSampler(training_data)
    train_dataloader = DataLoader(training_data, batch_size=BATCH_SIZE, sampler=sampler)

    model = DDP(make_model().to(device), device_ids=[local_rank])
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        for batch, (X, y) in enumerate(train_dataloader):
            X, y = X.to(device), y.to(device)
            pred = model(X)
            loss = loss_fn(pred, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if batch % 100 == 0:
                print(f"epoch {epoch} batch {batch}: loss {loss.item():>7f}")  # planted: PT016

    if rank == 0:
        torch.save(model.module.state_dict(), "model.pth")
        print("Saved PyTorch Model State to model.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
