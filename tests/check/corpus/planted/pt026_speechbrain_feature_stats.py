"""Acoustic model training where rank 0 computes global feature normalisation statistics once and caches them.

Planted: PT026 - the main process writes the mean/std cache, then every process loads it with no dist.barrier() in between
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def if_main_process():
    return dist.get_rank() == 0


def compute_stats(feats):
    flat = feats.reshape(-1, feats.size(-1))
    return {"mean": flat.mean(0), "std": flat.std(0).clamp_min(1e-5)}


class Frontend(nn.Module):
    def __init__(self, n_mels=40, hidden=256, n_classes=48):
        super().__init__()
        self.register_buffer("mean", torch.zeros(n_mels))
        self.register_buffer("std", torch.ones(n_mels))
        self.rnn = nn.LSTM(n_mels, hidden, num_layers=3, batch_first=True)
        self.out = nn.Linear(hidden, n_classes)

    def forward(self, feats):
        h, _ = self.rnn((feats - self.mean) / self.std)
        return self.out(h)


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    stats_file = os.path.join("save", "feature_stats.pt")

    feats = torch.randn(6000, 150, 40) * 4 + 2
    phones = torch.randint(0, 48, (6000, 150))
    dataset = TensorDataset(feats, phones)

    if if_main_process():
        os.makedirs("save", exist_ok=True)
        torch.save(compute_stats(feats), stats_file)
    stats = torch.load(stats_file, map_location="cpu", weights_only=True)  # planted: PT026

    net = Frontend()
    net.mean.copy_(stats["mean"])
    net.std.copy_(stats["std"])
    model = DDP(net.to(device), device_ids=[local_rank])
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=24, sampler=sampler, num_workers=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(15):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x).transpose(1, 2), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if if_main_process():
            torch.save(model.module.state_dict(), os.path.join("save", f"am_epoch{epoch}.ckpt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
