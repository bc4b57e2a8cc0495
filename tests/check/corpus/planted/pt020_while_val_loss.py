"""Speech enhancement model trained with DDP; validation walks the loader with an explicit while loop.

Planted: PT020 - the primary process prints val_loss_sum / val_count, summed over its own validation shard only
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from enhance import ConvTasNet, NoisySpeech


def validate(model, loader, device):
    model.eval()
    val_loss_sum, val_count = 0.0, 0
    batches = iter(loader)
    with torch.no_grad():
        while (batch := next(batches, None)) is not None:
            noisy, clean = batch
            noisy = noisy.to(device, non_blocking=True)
            clean = clean.to(device, non_blocking=True)
            val_loss_sum += F.l1_loss(model(noisy), clean, reduction="sum").item()
            val_count += clean.numel()
    model.train()
    return val_loss_sum, val_count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="./vctk_demand")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    args = parser.parse_args()

    torch.cuda.set_device(args.local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    device = torch.device("cuda", args.local_rank)

    train_set, val_set = NoisySpeech(args.root, "train"), NoisySpeech(args.root, "valid")
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler, num_workers=4)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, num_workers=4,
                            sampler=DistributedSampler(val_set, shuffle=False))

    model = DDP(ConvTasNet().to(device), device_ids=[args.local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        for noisy, clean in train_loader:
            noisy = noisy.to(device, non_blocking=True)
            clean = clean.to(device, non_blocking=True)
            loss = F.l1_loss(model(noisy), clean)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        val_loss_sum, val_count = validate(model, val_loader, device)
        if args.local_rank == -1 or dist.get_rank() == 0:
            print(f"epoch {epoch}: train loss {loss.item():.4f} val L1 {val_loss_sum / val_count:.5f}")  # planted: PT020
            torch.save(model.module.state_dict(), "convtasnet.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
