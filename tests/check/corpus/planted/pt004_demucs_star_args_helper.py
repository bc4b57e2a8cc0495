"""Music source separation (a small Demucs-like waveform U-Net) with a pass-through loader helper.

Planted: PT004 - shuffle=True and sampler= both go through a *args/**kwargs helper into DataLoader
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("demucs")
SOURCES = ("drums", "bass", "other", "vocals")


class StemSegments(Dataset):
    def __init__(self, n=20_000, seconds=6, sr=44_100):
        self.n, self.length = n, seconds * sr // 8

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        stems = torch.randn(len(SOURCES), 2, self.length) * 0.1
        return stems.sum(0), stems


class WaveUNet(nn.Module):
    def __init__(self, ch=48, depth=4):
        super().__init__()
        self.enc, self.dec = nn.ModuleList(), nn.ModuleList()
        c = 2
        for d in range(depth):
            out = ch * 2 ** d
            self.enc.append(nn.Sequential(nn.Conv1d(c, out, 8, 4, 2), nn.GELU()))
            self.dec.insert(0, nn.Sequential(nn.ConvTranspose1d(out, c if d else 2 * len(SOURCES), 8, 4, 2),
                                             nn.GELU() if d else nn.Identity()))
            c = out

    def forward(self, mix):
        skips, x = [], mix
        for enc in self.enc:
            skips.append(x)
            x = enc(x)
        for dec in self.dec:
            x = dec(x)
            skip = skips.pop()
            if x.size(1) == skip.size(1):
                x = x + skip[..., : x.size(-1)]
        return x.view(mix.size(0), len(SOURCES), 2, -1)


def make_loader(dataset, *args, **kwargs):
    return DataLoader(dataset, *args, **kwargs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=360)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--workers", type=int, default=6)
    args = ap.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    primary = dist.get_rank() == 0
    logging.basicConfig(level=logging.INFO if primary else logging.WARNING)

    model = DDP(WaveUNet().to(device), device_ids=[local_rank])
    optim = torch.optim.Adam(model.parameters(), lr=3e-4, betas=(0.9, 0.999))

    train_set = StemSegments()
    sampler = DistributedSampler(train_set)
    loader = make_loader(train_set, batch_size=args.batch_size, shuffle=True, sampler=sampler, num_workers=args.workers)  # planted: PT004

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        l1_sum = torch.zeros((), device=device)
        count = torch.zeros((), device=device)
        for mix, stems in loader:
            mix = mix.to(device)
            stems = stems.to(device)
            estimate = model(mix)
            loss = F.l1_loss(estimate[..., : stems.size(-1)], stems[..., : estimate.size(-1)])
            optim.zero_grad()
            loss.backward()
            optim.step()
            l1_sum += loss.detach() * mix.size(0)
            count += mix.size(0)
        dist.all_reduce(l1_sum)
        dist.all_reduce(count)
        if primary:
            log.info("epoch %d train l1 %.4f", epoch, (l1_sum / count).item())
            torch.save({"state": model.module.state_dict(), "sources": SOURCES}, "demucs_last.th")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
