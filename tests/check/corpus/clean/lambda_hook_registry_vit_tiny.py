import os
import time
from collections import defaultdict
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter

HOOKS: dict[str, list[Callable]] = defaultdict(list)


def register(event: str):
    def deco(fn):
        HOOKS[event].append(fn)
        return fn
    return deco


def fire(event: str, state: dict) -> None:
    for fn in HOOKS[event]:
        fn(state)


class PatchViT(nn.Module):
    def __init__(self, img=64, patch=8, dim=192, depth=12, heads=3, classes=200):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        n = (img // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, 0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, depth)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.size(0), -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.enc(x))[:, 0])


def main():
    dist.init_process_group("nccl")
    lr_idx = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(lr_idx)
    dev = torch.device(f"cuda:{lr_idx}")
    main_proc = dist.get_rank() == 0
    writer = SummaryWriter("runs/vit_tiny") if main_proc else None

    tf = T.Compose([T.RandomResizedCrop(64, scale=(0.35, 1)), T.RandomHorizontalFlip(), T.ToTensor()])
    ds = torchvision.datasets.ImageFolder("tiny-imagenet-200/train", tf)
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=128, sampler=sampler, num_workers=8, pin_memory=True, drop_last=True)
    net = PatchViT().to(dev)
    model = DDP(net, device_ids=[lr_idx])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    total = 100 * len(loader)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=total, pct_start=0.1)

    HOOKS["epoch_start"].append(lambda s: sampler.set_epoch(s["epoch"]))
    HOOKS["epoch_start"].append(lambda s: s.update(t0=time.time()))
    if main_proc:
        HOOKS["step_end"].append(
            lambda s: s["step"] % 100 == 0 and writer.add_scalar("train/loss", s["loss"], s["step"]))
        HOOKS["step_end"].append(
            lambda s: writer.add_scalar("train/lr", sched.get_last_lr()[0], s["step"]))

    @register("epoch_end")
    def reduce_and_report(s):
        buf = torch.tensor([s["loss_sum"], s["n"]], device=dev, dtype=torch.float64)
        dist.all_reduce(buf)
        s["epoch_loss"] = (buf[0] / buf[1]).item()
        if main_proc:
            print(f"epoch {s['epoch']} loss {s['epoch_loss']:.4f} ({time.time() - s['t0']:.0f}s)")

    @register("epoch_end")
    def checkpoint(s):
        if main_proc:
            torch.save({"model": net.state_dict(), "epoch": s["epoch"]}, "vit_tiny.pt")

    state = {"step": 0}
    for epoch in range(100):
        state.update(epoch=epoch, loss_sum=0.0, n=0)
        fire("epoch_start", state)
        model.train()
        for x, y in loader:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            state["step"] += 1
            state["loss"] = loss.item()
            state["loss_sum"] += state["loss"] * x.size(0)
            state["n"] += x.size(0)
            fire("step_end", state)
        fire("epoch_end", state)
    if writer is not None:
        writer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
