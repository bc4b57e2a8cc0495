"""ConvNeXt-style classifier; all output goes through logging with a filter that keeps rank 0 only."""
import logging
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class RankZeroFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return self.rank == 0 or record.levelno >= logging.ERROR


def get_logger(rank: int) -> logging.Logger:
    logger = logging.getLogger("convnext")
    handler = logging.StreamHandler(sys.stdout)
    handler.addFilter(RankZeroFilter(rank))
    handler.setFormatter(logging.Formatter("%(asctime)s [r%(rank)s] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pw = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        return x + self.pw(self.norm(y)).permute(0, 3, 1, 2)


def convnext_tiny(num_classes=100):
    return nn.Sequential(nn.Conv2d(3, 96, 4, 4), *[Block(96) for _ in range(3)], nn.Conv2d(96, 192, 2, 2),
                         *[Block(192) for _ in range(3)], nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(192, num_classes))


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    logger = get_logger(rank)
    device = torch.device("cuda", local_rank)

    model = DDP(convnext_tiny().to(device), device_ids=[local_rank], gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-3 * world / 8, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100)
    train = TensorDataset(torch.randn(25_000, 3, 64, 64), torch.randint(0, 100, (25_000,)))
    val = TensorDataset(torch.randn(5_000, 3, 64, 64), torch.randint(0, 100, (5_000,)))
    train_sampler = DistributedSampler(train)
    train_loader = DataLoader(train, batch_size=128, sampler=train_sampler, num_workers=4, drop_last=True)
    val_loader = DataLoader(val, batch_size=256, sampler=DistributedSampler(val, shuffle=False))
    logger.info("world size %d, %d train steps per epoch", world, len(train_loader))

    for epoch in range(100):
        train_sampler.set_epoch(epoch)
        model.train()
        for images, targets in train_loader:
            images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), targets, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        scheduler.step()

        model.eval()
        acc_loss = torch.zeros((), device=device)
        correct = torch.zeros((), device=device)
        n = 0
        with torch.no_grad():
            for images, targets in val_loader:
                images, targets = images.to(device), targets.to(device)
                out = model(images)
                acc_loss += F.cross_entropy(out, targets)
                correct += (out.argmax(1) == targets).float().mean()
                n += 1
        acc_loss /= n
        correct /= n
        dist.all_reduce(acc_loss, op=dist.ReduceOp.AVG)
        dist.all_reduce(correct, op=dist.ReduceOp.AVG)
        logger.info("epoch %d val loss %.4f val acc %.2f%%", epoch, acc_loss.item(), 100 * correct.item())
        if rank == 0 and epoch % 10 == 9:
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, f"convnext_ep{epoch}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
