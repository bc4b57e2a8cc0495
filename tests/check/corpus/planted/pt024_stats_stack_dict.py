"""Vision transformer fine-tuning that packs per-rank loss and accuracy into one tensor for a single reduction.

Planted: PT024 - stats = stack([loss, acc.mean()]) is all_reduce'd (SUM) and logged in a dict as loss/acc means, never divided by world size
"""
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("vit-ft")


class PatchViT(nn.Module):
    def __init__(self, patch=8, dim=192, depth=4, classes=100):
        super().__init__()
        self.patchify = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, 17, dim))
        self.blocks = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, 3, dim * 4, batch_first=True, norm_first=True), depth)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patchify(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.size(0), -1, -1), x], dim=1) + self.pos
        return self.head(self.blocks(x)[:, 0])


def main():
    logging.basicConfig(level=logging.INFO)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    ds = TensorDataset(torch.randn(50000, 3, 32, 32), torch.randint(0, 100, (50000,)))
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=128, sampler=sampler, num_workers=4, drop_last=True)
    model = DDP(PatchViT().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100 * len(loader))

    global_step = 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        model.train()
        for images, targets in loader:
            images, targets = images.to(device), targets.to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(images)
            loss = F.cross_entropy(logits.float(), targets, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            global_step += 1
            if global_step % 50 == 0:
                acc = (logits.argmax(-1) == targets).float()
                stats = torch.stack([loss.detach(), acc.mean()])
                dist.all_reduce(stats)  # planted: PT024
                metrics = {"train/loss": stats[0].item(), "train/acc": stats[1].item(), "step": global_step}
                if rank == 0:
                    log.info("%s", metrics)
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, "vit_ft_last.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
