"""Keyword-spotting fit() that returns early once validation accuracy stops improving.

Planted: PT025 - fit() returns out of the epoch loop based on val_acc computed on the rank's own shard only
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from kws import MatchboxNet, SpeechCommandsV2


def shard_accuracy(model, loader, device):
    model.eval()
    correct = 0
    seen = 0
    with torch.no_grad():
        for feats, labels in loader:
            feats = feats.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            correct += (model(feats).argmax(-1) == labels).sum().item()
            seen += labels.numel()
    return correct / max(seen, 1)


def fit(model, optimizer, train_loader, val_loader, device, rank, max_epochs=200, patience=10,
        min_delta=1e-3):
    best_acc = 0.0
    wait = 0
    for epoch in range(max_epochs):
        train_loader.sampler.set_epoch(epoch)
        model.train()
        for feats, labels in train_loader:
            feats = feats.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(feats), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        val_acc = shard_accuracy(model, val_loader, device)
        if val_acc > best_acc + min_delta:
            best_acc = val_acc
            wait = 0
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "epoch": epoch}, "kws_best.pt")
        else:
            wait += 1
        if wait > patience: return best_acc  # planted: PT025
    return best_acc


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_ds = SpeechCommandsV2("/data/sc2", "train")
    val_ds = SpeechCommandsV2("/data/sc2", "validation")
    train_loader = DataLoader(train_ds, batch_size=256, sampler=DistributedSampler(train_ds),
                              num_workers=8, pin_memory=True)
    val_loader = DataLoader(val_ds, batch_size=512, sampler=DistributedSampler(val_ds, shuffle=False),
                            num_workers=4)
    model = DDP(MatchboxNet(num_classes=35).to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    fit(model, optimizer, train_loader, val_loader, device, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
