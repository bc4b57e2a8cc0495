"""Food-101 classifier: train with DDP, rank 0 writes the final weights, every rank reloads them for testing.

Planted: PT026 - every rank torch.load()s the checkpoint right after rank 0's guarded torch.save, with no barrier
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import transforms
from torchvision.datasets import Food101
from torchvision.models import mobilenet_v3_large


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="./data")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--ckpt", default="food101_mbv3.pt")
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    train_tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor()])
    test_tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()])
    train_set = Food101(args.root, split="train", transform=train_tf, download=True)
    test_set = Food101(args.root, split="test", transform=test_tf)
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=64, sampler=train_sampler, num_workers=8, pin_memory=True)
    test_loader = DataLoader(test_set, batch_size=128, sampler=DistributedSampler(test_set, shuffle=False))

    model = DDP(mobilenet_v3_large(num_classes=101).to(device), device_ids=[local_rank])
    optimizer = torch.optim.RMSprop(model.parameters(), lr=0.01, alpha=0.9, momentum=0.9, weight_decay=1e-5)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for images, labels in train_loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            loss = F.cross_entropy(model(images), labels, label_smoothing=0.1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()

    if rank == 0:
        torch.save(model.module.state_dict(), args.ckpt)
    state = torch.load(args.ckpt, map_location=device, weights_only=True)  # planted: PT026
    model.module.load_state_dict(state)

    model.eval()
    stats = torch.zeros(2, device=device)
    with torch.no_grad():
        for images, labels in test_loader:
            images, labels = images.to(device), labels.to(device)
            stats[0] += (model(images).argmax(1) == labels).sum()
            stats[1] += labels.numel()
    dist.all_reduce(stats)
    if rank == 0:
        print(f"test top-1 {100.0 * stats[0].item() / stats[1].item():.2f}%")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
