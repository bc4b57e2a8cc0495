"""Fine-grained classification: keep the best checkpoint during training, reload it for the final test pass.

Planted: PT026 - after the epoch loop every rank reloads model_best.pth, which rank 0 may still be writing, with no barrier
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision.models as models
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from cub_data import build_cub


BEST_PATH = "model_best.pth"


def save_checkpoint(state, is_best, filename="checkpoint.pth"):
    torch.save(state, filename)
    if is_best:
        torch.save(state, BEST_PATH)


def run_epoch(model, loader, criterion, optimizer, device):
    model.train()
    for images, target in loader:
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    counts = torch.zeros(2, device=device)
    for images, target in loader:
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        counts[0] += (model(images).argmax(1) == target).sum()
        counts[1] += target.numel()
    dist.all_reduce(counts)
    return (100.0 * counts[0] / counts[1]).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/data/CUB_200_2011")
    parser.add_argument("--epochs", type=int, default=60)
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_ds, val_ds, test_ds = build_cub(args.data)
    train_sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=32, sampler=train_sampler, num_workers=8)
    val_loader = DataLoader(val_ds, batch_size=64, sampler=DistributedSampler(val_ds, shuffle=False))
    test_loader = DataLoader(test_ds, batch_size=64, sampler=DistributedSampler(test_ds, shuffle=False))

    model = models.resnet50(num_classes=200).to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs)

    best_acc1 = 0.0
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        run_epoch(model, train_loader, criterion, optimizer, device)
        acc1 = evaluate(model, val_loader, device)
        scheduler.step()
        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        if rank == 0:
            print(f"epoch {epoch}: val Acc@1 {acc1:.2f} best {best_acc1:.2f}")
            save_checkpoint({"epoch": epoch + 1, "state_dict": model.module.state_dict(),
                             "best_acc1": best_acc1}, is_best)

    best = torch.load(BEST_PATH, map_location=device, weights_only=True)  # planted: PT026
    model.module.load_state_dict(best["state_dict"])
    test_acc = evaluate(model, test_loader, device)
    if rank == 0:
        print(f"test Acc@1 of best checkpoint (epoch {best['epoch']}): {test_acc:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
