"""Linear probing of a self-supervised ResNet-50 backbone on ImageNet with DDP.

Planted: PT008 - the pretrained backbone weights are read with torch.load(args.pretrained, map_location="cpu"), no weights_only=.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/datasets/imagenet")
    parser.add_argument("--pretrained", required=True)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    rank = dist.get_rank()
    torch.cuda.set_device(local_rank)

    model = torchvision.models.resnet50()
    state = torch.load(args.pretrained, map_location="cpu")  # planted: PT008
    state = {k.replace("backbone.", ""): v for k, v in state.items() if k.startswith("backbone.")}
    missing = model.load_state_dict(state, strict=False)
    assert set(missing.missing_keys) == {"fc.weight", "fc.bias"}
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith("fc.")
    model.fc.weight.data.normal_(mean=0.0, std=0.01)
    model.fc.bias.data.zero_()
    model = nn.parallel.DistributedDataParallel(model.cuda(), device_ids=[local_rank])

    tf = torchvision.transforms.Compose([torchvision.transforms.RandomResizedCrop(224), torchvision.transforms.ToTensor()])
    train_set = torchvision.datasets.ImageFolder(os.path.join(args.data, "train"), tf)
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=256, sampler=sampler, num_workers=8, pin_memory=True)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.eval()
        for images, target in loader:
            images = images.cuda(non_blocking=True)
            target = target.cuda(non_blocking=True)
            loss = nn.functional.cross_entropy(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
        if rank == 0:
            torch.save({"fc": model.module.fc.state_dict(), "epoch": epoch}, "linear_probe.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
