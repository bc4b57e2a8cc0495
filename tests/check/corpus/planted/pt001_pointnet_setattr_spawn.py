"""PointNet part segmentation, one process per GPU started with mp.spawn on every node.

Planted: PT001 - args.rank (node_rank * ngpus_per_node + gpu, set by a helper) is used in .cuda()
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class PointNetSeg(nn.Module):
    def __init__(self, num_parts=50):
        super().__init__()
        self.local = nn.Sequential(nn.Conv1d(3, 64, 1), nn.BatchNorm1d(64), nn.ReLU(),
                                   nn.Conv1d(64, 128, 1), nn.BatchNorm1d(128), nn.ReLU())
        self.glob = nn.Sequential(nn.Conv1d(128, 1024, 1), nn.BatchNorm1d(1024), nn.ReLU())
        self.seg = nn.Sequential(nn.Conv1d(128 + 1024, 256, 1), nn.BatchNorm1d(256), nn.ReLU(),
                                 nn.Conv1d(256, num_parts, 1))

    def forward(self, pts):
        local = self.local(pts)
        g = self.glob(local).max(dim=2, keepdim=True).values.expand(-1, -1, pts.size(2))
        return self.seg(torch.cat([local, g], dim=1))


def _fill_identity(ns, gpu):
    setattr(ns, "gpu", gpu)
    setattr(ns, "rank", ns.node_rank * ns.ngpus_per_node + gpu)


def setup(ns, gpu):
    _fill_identity(ns, gpu)
    dist.init_process_group("nccl", init_method=ns.dist_url, world_size=ns.world_size, rank=ns.rank)
    torch.cuda.set_device(ns.gpu)


def shapenet_parts(n=4096, points=2048):
    return TensorDataset(torch.randn(n, 3, points), torch.randint(0, 50, (n, points)))


def worker(gpu, ns):
    setup(ns, gpu)
    logging.basicConfig(level=logging.INFO)
    log = logging.getLogger(f"pointnet.r{ns.rank}")

    model = PointNetSeg().cuda(ns.rank)  # planted: PT001
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model, device_ids=[ns.gpu])

    data = shapenet_parts()
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=ns.batch_size, sampler=sampler, num_workers=4, pin_memory=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(ns.epochs):
        sampler.set_epoch(epoch)
        model.train()
        seen = torch.zeros(2, device=f"cuda:{ns.gpu}")
        for pts, parts in loader:
            pts = pts.cuda(ns.gpu, non_blocking=True)
            parts = parts.cuda(ns.gpu, non_blocking=True)
            logits = model(pts)
            loss = F.cross_entropy(logits, parts)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen[0] += (logits.argmax(1) == parts).sum()
            seen[1] += parts.numel()
        dist.all_reduce(seen)
        if ns.rank == 0:
            log.info("epoch %d point acc %.4f", epoch, (seen[0] / seen[1]).item())
            torch.save(model.module.state_dict(), os.path.join(ns.out, "pointnet_seg.pth"))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--node-rank", dest="node_rank", type=int, default=0)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--dist-url", dest="dist_url", default="tcp://127.0.0.1:23456")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--out", default=".")
    ns = p.parse_args()
    ns.ngpus_per_node = torch.cuda.device_count()
    ns.world_size = ns.ngpus_per_node * ns.nodes
    mp.spawn(worker, nprocs=ns.ngpus_per_node, args=(ns,))


if __name__ == "__main__":
    main()
