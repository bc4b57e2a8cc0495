"""WaveNet vocoder conditioned on mel frames. Single file, launch with torchrun."""
import math
import os
import random
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

CONFIG = dict(
    residual_channels=64,
    skip_channels=128,
    cycles=3,
    layers_per_cycle=10,
    n_mels=80,
    hop=256,
    segment=8192,
    quant=256,
    batch_size=6,
    lr=2e-4,
    epochs=300,
    log_every=50,
    ckpt_every=10,
    out_dir="runs/wavenet",
    seed=1234,
)

RANK = 0
LOCAL_RANK = 0
WORLD = 1
DEVICE = None
STEP = 0
BEST = math.inf


def setup():
    global RANK, LOCAL_RANK, WORLD, DEVICE
    dist.init_process_group("nccl")
    RANK = dist.get_rank()
    WORLD = dist.get_world_size()
    LOCAL_RANK = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(LOCAL_RANK)
    DEVICE = torch.device("cuda", LOCAL_RANK)
    seed = CONFIG["seed"] + RANK
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def master():
    return RANK == 0


def mulaw(x, q=CONFIG["quant"]):
    mu = q - 1
    y = torch.sign(x) * torch.log1p(mu * x.abs()) / math.log1p(mu)
    return ((y + 1) / 2 * mu + 0.5).long()


class PairedAudio(Dataset):
    def __init__(self, n=4000):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        wav = torch.rand(CONFIG["segment"], generator=g) * 2 - 1
        mel = torch.randn(CONFIG["n_mels"], CONFIG["segment"] // CONFIG["hop"], generator=g)
        return wav, mel


class ResBlock(nn.Module):
    def __init__(self, dilation):
        super().__init__()
        c = CONFIG["residual_channels"]
        self.dilated = nn.Conv1d(c, 2 * c, 2, dilation=dilation)
        self.cond = nn.Conv1d(CONFIG["n_mels"], 2 * c, 1)
        self.res = nn.Conv1d(c, c, 1)
        self.skip = nn.Conv1d(c, CONFIG["skip_channels"], 1)
        self.pad = dilation

    def forward(self, x, c):
        h = self.dilated(F.pad(x, (self.pad, 0))) + self.cond(c)
        a, b = h.chunk(2, dim=1)
        h = torch.tanh(a) * torch.sigmoid(b)
        return (x + self.res(h)) * math.sqrt(0.5), self.skip(h)


class WaveNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(CONFIG["quant"], CONFIG["residual_channels"])
        self.upsample = nn.Upsample(scale_factor=CONFIG["hop"], mode="nearest")
        self.blocks = nn.ModuleList(
            ResBlock(2 ** (i % CONFIG["layers_per_cycle"]))
            for i in range(CONFIG["cycles"] * CONFIG["layers_per_cycle"])
        )
        self.out = nn.Sequential(
            nn.ReLU(), nn.Conv1d(CONFIG["skip_channels"], CONFIG["skip_channels"], 1),
            nn.ReLU(), nn.Conv1d(CONFIG["skip_channels"], CONFIG["quant"], 1),
        )

    def forward(self, tokens, mel):
        x = self.embed(tokens).transpose(1, 2)
        c = self.upsample(mel)
        skips = 0
        for blk in self.blocks:
            x, s = blk(x, c)
            skips = skips + s
        return self.out(skips)


def train_epoch(model, loader, opt, epoch):
    global STEP
    model.train()
    t0 = time.time()
    running = torch.zeros(2, device=DEVICE)
    for wav, mel in loader:
        wav = wav.to(DEVICE, non_blocking=True)
        mel = mel.to(DEVICE, non_blocking=True)
        target = mulaw(wav)
        inp = F.pad(target[:, :-1], (1, 0), value=CONFIG["quant"] // 2)
        logits = model(inp, mel)
        loss = F.cross_entropy(logits, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        STEP += 1
        running[0] += loss.detach()
        running[1] += 1
        if STEP % CONFIG["log_every"] == 0:
            snap = running.clone()
            dist.all_reduce(snap)
            if master():
                print(f"epoch {epoch} step {STEP} nll {(snap[0] / snap[1]).item():.4f} "
                      f"{(time.time() - t0) / CONFIG['log_every']:.3f}s/it")
            t0 = time.time()
    dist.all_reduce(running)
    return (running[0] / running[1]).item()


def main():
    global BEST
    setup()
    os.makedirs(CONFIG["out_dir"], exist_ok=True)
    ds = PairedAudio()
    sampler = DistributedSampler(ds, num_replicas=WORLD, rank=RANK)
    loader = DataLoader(ds, batch_size=CONFIG["batch_size"], sampler=sampler,
                        num_workers=4, pin_memory=True, drop_last=True)
    net = WaveNet().to(DEVICE)
    model = DDP(net, device_ids=[LOCAL_RANK])
    opt = torch.optim.Adam(model.parameters(), lr=CONFIG["lr"])
    for epoch in range(CONFIG["epochs"]):
        sampler.set_epoch(epoch)
        nll = train_epoch(model, loader, opt, epoch)
        if master():
            if nll < BEST:
                BEST = nll
                torch.save(net.state_dict(), os.path.join(CONFIG["out_dir"], "best.pt"))
            if (epoch + 1) % CONFIG["ckpt_every"] == 0:
                torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": STEP},
                           os.path.join(CONFIG["out_dir"], f"ckpt_{epoch + 1}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
