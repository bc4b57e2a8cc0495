"""CIFAR-100 ResNet training; local rank 0 of each node downloads the data while the others wait."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
import torchvision.transforms as T
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def get_datasets(root, local_rank):
    norm = T.Normalize((0.507, 0.487, 0.441), (0.267, 0.256, 0.276))
    train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    test_tf = T.Compose([T.ToTensor(), norm])
    if local_rank != 0:
        dist.barrier()
    train = torchvision.datasets.CIFAR100(root, train=True, download=(local_rank == 0), transform=train_tf)
    test = torchvision.datasets.CIFAR100(root, train=False, download=(local_rank == 0), transform=test_tf)
    if local_rank == 0:
        dist.barrier()
    return train, test


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="./data")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--bs", type=int, default=128)
    args = p.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    world_rank = dist.get_rank()
    device = torch.device(f"cuda:{local_rank}")

    train_set, test_set = get_datasets(args.data, local_rank)
    train_sampler = DistributedSampler(train_set)
    test_sampler = DistributedSampler(test_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.bs, sampler=train_sampler, num_workers=4, pin_memory=True)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler, num_workers=4)

    net = torchvision.models.resnet18(num_classes=100)
    net.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    net.maxpool = nn.Identity()
    net = nn.SyncBatchNorm.convert_sync_batchnorm(net).cuda()
    model = DDP(net, device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * dist.get_world_size(), momentum=0.9, weight_decay=5e-4, nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1 * dist.get_world_size(), epochs=args.epochs,
                                                steps_per_epoch=len(train_loader))
    scaler = torch.amp.GradScaler()

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            with torch.amp.autocast(device_type="cuda"):
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()

        model.eval()
        hits = torch.zeros(2, device=device)
        with torch.no_grad():
            for x, y in test_loader:
                x, y = x.to(device), y.to(device)
                hits[0] += (model(x).argmax(1) == y).sum()
                hits[1] += y.size(0)
        dist.all_reduce(hits, op=dist.ReduceOp.SUM)
        if world_rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  test acc {100 * hits[0].item() / hits[1].item():.2f}%")
            torch.save(model.module.state_dict(), "cifar100_resnet18.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
