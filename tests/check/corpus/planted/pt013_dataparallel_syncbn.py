"""Single-process multi-GPU ResNet training on CIFAR-10 with nn.DataParallel.

Planted: PT013 - convert_sync_batchnorm() on a model that is then run under nn.DataParallel (no process group)
"""
import argparse
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader

logging.basicConfig(level=logging.INFO)
log = logging.getLogger("cifar")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--sync-bn", action="store_true")
    parser.add_argument("--resume", default="")
    args = parser.parse_args()

    device = torch.device("cuda")
    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor()])
    train_set = torchvision.datasets.CIFAR10("./data", train=True, download=True, transform=transform)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=8)

    model = torchvision.models.resnet18(num_classes=10)
    if args.resume:
        state = torch.load(args.resume, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
    if args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # planted: PT013
    model = nn.DataParallel(model).to(device)

    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    for epoch in range(args.epochs):
        model.train()
        for step, (images, labels) in enumerate(loader):
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 50 == 0:
                log.info("epoch %d step %d loss %.4f", epoch, step, loss.item())
        scheduler.step()
        torch.save({"model": model.module.state_dict(), "epoch": epoch}, "resnet18_cifar.pth")


if __name__ == "__main__":
    main()
