import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

STEMS = ("drums", "bass", "other", "vocals")


class Mixtures(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        sources = torch.randn(len(STEMS), 2, 2 ** 17, generator=g) * 0.1
        return sources.sum(0), sources


class ConvTasNetLite(nn.Module):
    def __init__(self, n_src=len(STEMS), enc=256, hidden=512, blocks=8):
        super().__init__()
        self.encoder = nn.Conv1d(2, enc, 16, stride=8)
        self.tcn = nn.Sequential(*[
            nn.Sequential(nn.Conv1d(enc, hidden, 1), nn.PReLU(), nn.GroupNorm(1, hidden),
                          nn.Conv1d(hidden, hidden, 3, padding=2 ** b, dilation=2 ** b, groups=hidden),
                          nn.PReLU(), nn.GroupNorm(1, hidden), nn.Conv1d(hidden, enc, 1))
            for b in range(blocks)])
        self.masks = nn.Conv1d(enc, n_src * enc, 1)
        self.decoder = nn.ConvTranspose1d(enc, 2, 16, stride=8)
        self.n_src, self.enc = n_src, enc

    def forward(self, mix):
        w = torch.relu(self.encoder(mix))
        h = w
        for blk in self.tcn:
            h = h + blk(h)
        m = torch.sigmoid(self.masks(h)).view(mix.size(0), self.n_src, self.enc, -1)
        est = self.decoder((m * w.unsqueeze(1)).flatten(0, 1))
        return est[..., :mix.size(-1)].view(mix.size(0), self.n_src, 2, -1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--resume", default="")
    p.add_argument("--epochs", type=int, default=120)
    p.add_argument("--save", default="tasnet.th")
    args = p.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device(f"cuda:{local_rank}")
    is_head = dist.get_rank() == 0

    model = ConvTasNetLite().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 40, 0.3)
    first_epoch = 0
    if args.resume:
        ckpt = torch.load(args.resume, map_location={"cuda:0": f"cuda:{local_rank}"}, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        first_epoch = ckpt["epoch"] + 1
    ddp = DDP(model, device_ids=[local_rank])

    ds = Mixtures()
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=6, pin_memory=True)

    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        l1 = torch.zeros(len(STEMS) + 1, device=device)
        for mix, sources in loader:
            mix = mix.to(device, non_blocking=True)
            sources = sources.to(device, non_blocking=True)
            est = ddp(mix)
            per_stem = (est - sources).abs().mean(dim=(0, 2, 3))
            loss = per_stem.mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(ddp.parameters(), 5.0)
            optimizer.step()
            l1[:-1] += per_stem.detach()
            l1[-1] += 1
        scheduler.step()
        dist.all_reduce(l1)
        if is_head:
            per = {s: (l1[i] / l1[-1]).item() for i, s in enumerate(STEMS)}
            print(f"epoch {epoch} " + " ".join(f"{k}:{v:.4f}" for k, v in per.items()))
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "epoch": epoch}, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
