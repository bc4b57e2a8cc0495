"""SimCLR contrastive pretraining with DDP, resumable from a checkpoint file.

torchrun --nproc_per_node=4 simclr.py --resume runs/simclr/last.pt
Planted: PT008 - resume reads the checkpoint with torch.load(fh, map_location=device), no weights_only
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

logger = logging.getLogger("simclr")


class Encoder(nn.Module):
    def __init__(self, feat_dim=128):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.Conv2d(64, 128, 3, 2, 1), nn.BatchNorm2d(128), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.projector = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, feat_dim))

    def forward(self, x):
        return F.normalize(self.projector(self.backbone(x)), dim=1)


def augment(x):
    flip = torch.rand(x.shape[0], 1, 1, 1, device=x.device) < 0.5
    x = torch.where(flip, x.flip(-1), x)
    return x + 0.1 * torch.randn_like(x)


def nt_xent(z1, z2, tau=0.2):
    z = torch.cat([z1, z2])
    sim = z @ z.t() / tau
    sim.fill_diagonal_(float("-inf"))
    n = z1.shape[0]
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(sim, targets)


def main(args):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    model = Encoder().to(device)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3 * args.batch_size / 256, momentum=0.9, weight_decay=1e-6)
    start_epoch = 0
    if args.resume and os.path.isfile(args.resume):
        with open(args.resume, "rb") as fh:
            ckpt = torch.load(fh, map_location=device)  # planted: PT008
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch = ckpt["epoch"] + 1

    dataset = TensorDataset(torch.rand(50000, 3, 32, 32))
    sampler = DistributedSampler(dataset, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=4, drop_last=True)

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for step, (x,) in enumerate(loader):
            x = x.to(device, non_blocking=True)
            z1, z2 = model(torch.cat([augment(x), augment(x)])).chunk(2)
            loss = nt_xent(z1, z2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0 and step % 100 == 0:
                logger.info("epoch %d step %d nt-xent %.4f", epoch, step, loss.item())
        if rank == 0:
            os.makedirs(args.out_dir, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                       os.path.join(args.out_dir, "last.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--resume", default="")
    parser.add_argument("--out-dir", default="runs/simclr")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=256)
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())
