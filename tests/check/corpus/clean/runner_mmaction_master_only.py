"""Epoch-based runner for video recognition with get_dist_info() and @master_only hooks."""
import functools
import json
import os
import os.path as osp
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
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
        return None

    return wrapper


def init_dist(backend="nccl"):
    num_gpus = torch.cuda.device_count()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank % num_gpus)
    dist.init_process_group(backend=backend)


class Clips(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, idx):
        return {"imgs": torch.randn(3, 8, 112, 112), "label": torch.tensor(idx % 400)}


class Recognizer3D(nn.Module):
    def __init__(self, num_classes=400):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv3d(3, 64, 3, padding=1), nn.BatchNorm3d(64), nn.ReLU(),
                                      nn.AdaptiveAvgPool3d(1), nn.Flatten())
        self.cls_head = nn.Linear(64, num_classes)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, imgs, label):
        cls_score = self.cls_head(self.backbone(imgs))
        return {"loss_cls": self.loss(cls_score, label), "top1": (cls_score.argmax(1) == label).float().mean()}


class EpochBasedRunner:
    def __init__(self, model, optimizer, work_dir, max_epochs):
        self.model, self.optimizer = model, optimizer
        self.work_dir, self._max_epochs = work_dir, max_epochs
        self.rank, self.world_size = get_dist_info()
        self._epoch, self._iter = 0, 0
        self.log_buffer = []

    @master_only
    def save_checkpoint(self, filename_tmpl="epoch_{}.pth"):
        os.makedirs(self.work_dir, exist_ok=True)
        module = self.model.module if hasattr(self.model, "module") else self.model
        meta = {"epoch": self._epoch + 1, "iter": self._iter}
        torch.save({"meta": meta, "state_dict": module.state_dict(), "optimizer": self.optimizer.state_dict()},
                   osp.join(self.work_dir, filename_tmpl.format(self._epoch + 1)))

    @master_only
    def log_summary(self, stats):
        line = json.dumps({"epoch": self._epoch + 1, "iter": self._iter, **stats})
        print(line)
        os.makedirs(self.work_dir, exist_ok=True)
        with open(osp.join(self.work_dir, "log.json"), "a") as f:
            f.write(line + "\n")

    def train(self, data_loader):
        self.model.train()
        data_loader.sampler.set_epoch(self._epoch)
        totals = torch.zeros(3, device=torch.cuda.current_device())
        t0 = time.time()
        for data_batch in data_loader:
            imgs = data_batch["imgs"].cuda(non_blocking=True)
            label = data_batch["label"].cuda(non_blocking=True)
            outputs = self.model(imgs, label)
            self.optimizer.zero_grad()
            outputs["loss_cls"].backward()
            self.optimizer.step()
            n = imgs.size(0)
            totals += torch.stack([outputs["loss_cls"].detach() * n, outputs["top1"].detach() * n,
                                   torch.tensor(float(n), device=totals.device)])
            self._iter += 1
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        self.log_summary({"loss_cls": (totals[0] / totals[2]).item(), "top1_acc": (totals[1] / totals[2]).item(),
                          "time": time.time() - t0})
        self._epoch += 1

    def run(self, data_loader):
        while self._epoch < self._max_epochs:
            self.train(data_loader)
            self.save_checkpoint()


def main():
    init_dist("nccl")
    rank, world_size = get_dist_info()
    dataset = Clips()
    sampler = DistributedSampler(dataset, world_size, rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=4, pin_memory=True)
    model = Recognizer3D().cuda()
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()], broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    runner = EpochBasedRunner(model, optimizer, work_dir="work_dirs/r3d", max_epochs=50)
    runner.run(loader)


if __name__ == "__main__":
    main()
