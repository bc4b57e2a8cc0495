"""Helper-spread shape: build_sampler returns the sampler, train_one_epoch sets the epoch on loader.sampler, validate(val_loader, model, ...)."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


def build_sampler(dataset, training):
    return DistributedSampler(dataset, shuffle=training, drop_last=training)


def build_loader(dataset, batch_size, training):
    sampler = build_sampler(dataset, training)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=4, pin_memory=True)


def train_one_epoch(train_loader, model, criterion, optimizer, device, epoch):
    train_loader.sampler.set_epoch(epoch)
    model.train()
    for images, target in train_loader:
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def validate(val_loader, model, criterion, device):
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    with torch.no_grad():
        for images, target in val_loader:
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(images)
            sums[0] += criterion(output, target).item() * target.size(0)
            sums[1] += output.argmax(1).eq(target).sum().item()
            sums[2] += target.size(0)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    return sums[0].item() / sums[2].item(), 100.0 * sums[1].item() / sums[2].item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--save", default="best_model.pt")
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    device = torch.device("cuda", local_rank)

    from data import get_datasets
    from model import Classifier
    train_set, val_set = get_datasets()
    train_loader = build_loader(train_set, args.batch_size, training=True)
    val_loader = build_loader(val_set, args.batch_size, training=False)
    model = DDP(Classifier().to(device), device_ids=[local_rank])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[25, 40])
    best_acc = 0.0
    for epoch in range(args.epochs):
        train_one_epoch(train_loader, model, criterion, optimizer, device, epoch)
        val_loss, acc = validate(val_loader, model, criterion, device)
        scheduler.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: val_loss {val_loss:.4f} acc {acc:.2f} (best {best_acc:.2f})")
            if acc > best_acc:
                torch.save(model.module.state_dict(), args.save)
        best_acc = max(best_acc, acc)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
