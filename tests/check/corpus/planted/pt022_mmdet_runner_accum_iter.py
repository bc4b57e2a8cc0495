"""Epoch-based runner class (run / train_epoch / train_iter / save_checkpoint) with gradient accumulation.

Planted: PT022 - Runner.train_iter() calls self.optimizer.zero_grad() before every forward, yet steps only every self.accum_iter iterations
"""
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as MMDistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("mmdet")


class Runner:
    def __init__(self, model, optimizer, data_loader, work_dir, max_epochs, accum_iter=2):
        self.model = model
        self.optimizer = optimizer
        self.data_loader = data_loader
        self.work_dir = work_dir
        self.max_epochs = max_epochs
        self.accum_iter = accum_iter
        self.rank = dist.get_rank()
        self.device = next(model.parameters()).device
        self.epoch = 0
        self._inner_iter = 0
        self._iter = 0

    def train_iter(self, data_batch):
        imgs, gt_labels = (t.to(self.device, non_blocking=True) for t in data_batch)
        self.optimizer.zero_grad()  # planted: PT022
        cls_score = self.model(imgs)
        loss = F.cross_entropy(cls_score, gt_labels) / self.accum_iter
        loss.backward()
        if (self._inner_iter + 1) % self.accum_iter == 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=35, norm_type=2)
            self.optimizer.step()
            self._iter += 1
        return loss.detach() * self.accum_iter

    def train_epoch(self):
        self.model.train()
        self.data_loader.sampler.set_epoch(self.epoch)
        for i, data_batch in enumerate(self.data_loader):
            self._inner_iter = i
            loss = self.train_iter(data_batch)
            if self.rank == 0 and (i + 1) % 50 == 0:
                logger.info("Epoch [%d][%d/%d] loss: %.4f", self.epoch + 1, i + 1, len(self.data_loader), loss.item())
        self.epoch += 1

    def save_checkpoint(self):
        if self.rank != 0:
            return
        os.makedirs(self.work_dir, exist_ok=True)
        torch.save({"meta": {"epoch": self.epoch, "iter": self._iter},
                    "state_dict": self.model.module.state_dict(),
                    "optimizer": self.optimizer.state_dict()}, os.path.join(self.work_dir, f"epoch_{self.epoch}.pth"))

    def run(self):
        while self.epoch < self.max_epochs:
            self.train_epoch()
            self.save_checkpoint()


def main():
    logging.basicConfig(level=logging.INFO)
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)

    backbone = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3), nn.BatchNorm2d(64), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 80))
    backbone = nn.SyncBatchNorm.convert_sync_batchnorm(backbone)
    model = MMDistributedDataParallel(backbone.cuda(), device_ids=[local_rank], broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, weight_decay=1e-4)

    dataset = TensorDataset(torch.randn(4000, 3, 128, 128), torch.randint(0, 80, (4000,)))
    sampler = DistributedSampler(dataset, shuffle=True)
    data_loader = DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=2)

    Runner(model, optimizer, data_loader, "work_dirs/accum", max_epochs=12, accum_iter=4).run()


if __name__ == "__main__":
    main()
