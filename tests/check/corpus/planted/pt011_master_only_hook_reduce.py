"""Instance-level retrieval training with an mmcv-like runner and hooks, without mmcv.

python -m torch.distributed.run --nproc_per_node=4 train_retrieval.py --work-dir work_dirs/arcface
Planted: PT011 - all_reduce inside a @master_only hook method, so only rank 0 enters the collective
"""
import argparse
import functools
import logging
import os
import os.path as osp

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def get_dist_info():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def master_only(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        rank, _ = get_dist_info()
        if rank == 0:
            return func(*args, **kwargs)
    return wrapper


class ArcMarginHead(nn.Module):
    def __init__(self, dim=128, num_classes=1000, s=30.0, m=0.3):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_classes, dim) * 0.01)
        self.s, self.m = s, m

    def forward(self, emb, labels):
        cos = F.linear(F.normalize(emb), F.normalize(self.weight)).clamp(-1 + 1e-6, 1 - 1e-6)
        theta = torch.acos(cos)
        target = torch.cos(theta + self.m)
        onehot = F.one_hot(labels, cos.shape[1]).bool()
        return F.cross_entropy(self.s * torch.where(onehot, target, cos), labels)


class Embedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1), nn.ReLU(), nn.Conv2d(64, 128, 3, 2, 1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = ArcMarginHead()

    def forward(self, img, labels):
        return self.head(self.backbone(img), labels)


class LossMeterHook:
    def __init__(self, logger):
        self.logger = logger

    @master_only
    def after_train_epoch(self, runner, epoch_loss):
        dist.all_reduce(epoch_loss, op=dist.ReduceOp.AVG)  # planted: PT011
        self.logger.info("Epoch(train) [%d] mean loss over ranks: %.4f", runner.epoch, epoch_loss.item())


class Runner:
    def __init__(self, model, optimizer, loader, sampler, work_dir, hooks):
        self.model, self.optimizer = model, optimizer
        self.loader, self.sampler = loader, sampler
        self.work_dir, self.hooks = work_dir, hooks
        self.rank, _ = get_dist_info()
        self.epoch = 0

    def train_epoch(self):
        self.sampler.set_epoch(self.epoch)
        self.model.train()
        total = torch.zeros((), device="cuda")
        for n, (img, labels) in enumerate(self.loader, 1):
            img, labels = img.cuda(non_blocking=True), labels.cuda(non_blocking=True)
            loss = self.model(img, labels)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            total += (loss.detach() - total) / n
        for hook in self.hooks:
            hook.after_train_epoch(self, total)
        if self.rank == 0:
            torch.save({"state_dict": self.model.module.state_dict(), "epoch": self.epoch},
                       osp.join(self.work_dir, "latest.pth"))
        self.epoch += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--work-dir", default="work_dirs/arcface")
    parser.add_argument("--max-epochs", type=int, default=20)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    logging.basicConfig(level=logging.INFO)

    dataset = TensorDataset(torch.randn(30000, 3, 64, 64), torch.randint(0, 1000, (30000,)))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=128, sampler=sampler, num_workers=4, drop_last=True)
    model = DistributedDataParallel(Embedder().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    runner = Runner(model, optimizer, loader, sampler, args.work_dir, [LossMeterHook(logging.getLogger("mmcls"))])
    while runner.epoch < args.max_epochs:
        runner.train_epoch()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
