"""Image classification with best-checkpoint selection and a final test pass on the best weights.

torchrun --nproc_per_node=4 train_cls.py --out runs/cls
Planted: PT009 - every rank reloads the best checkpoint with torch.load(best_path, weights_only=True), no map_location
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("cls")


def make_loader(ds, batch_size, train):
    sampler = DistributedSampler(ds, shuffle=train)
    return DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=4, pin_memory=True), sampler


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    correct = torch.zeros((), device=device)
    total = torch.zeros((), device=device)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        correct += (model(x).argmax(1) == y).sum()
        total += y.numel()
    dist.all_reduce(correct)
    dist.all_reduce(total)
    return (correct / total).item()


def main(args):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()
    best_path = os.path.join(args.out, "best.pt")

    def split(n):
        return TensorDataset(torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,)))

    train_loader, train_sampler = make_loader(split(45000), 128, train=True)
    val_loader, _ = make_loader(split(5000), 256, train=False)
    test_loader, _ = make_loader(split(10000), 256, train=False)

    net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(128, 10)).to(device)
    model = DDP(net, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.1, total_steps=args.epochs * len(train_loader))

    best_acc = 0.0
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
        val_acc = evaluate(model, val_loader, device)
        if val_acc > best_acc:
            best_acc = val_acc
            if rank == 0:
                os.makedirs(args.out, exist_ok=True)
                torch.save(model.module.state_dict(), best_path)
        if rank == 0:
            logger.info("epoch %d val acc %.4f (best %.4f)", epoch, val_acc, best_acc)

    dist.barrier()
    net.load_state_dict(torch.load(best_path, weights_only=True))  # planted: PT009
    test_acc = evaluate(model, test_loader, device)
    if rank == 0:
        logger.info("test accuracy of best checkpoint: %.4f", test_acc)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", default="runs/cls")
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())
