"""Pose estimation training with a hand-rolled EpochBasedRunner (mmpose-like, without mmcv hooks).

python -m torch.distributed.run --nproc_per_node=4 train_pose.py --work-dir work_dirs/hrnet
Planted: PT005 - runner's while-loop over epochs never calls set_epoch on the shuffling DistributedSampler
"""
import argparse
import logging
import os
import os.path as osp

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def get_dist_info():
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class KeypointDataset(Dataset):
    def __init__(self, n=8000, joints=17):
        self.n, self.joints = n, joints

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        return torch.randn(3, 256, 192), torch.rand(self.joints, 64, 48)


class SimpleBaseline(nn.Module):
    def __init__(self, joints=17):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.Conv2d(64, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU())
        self.final = nn.Conv2d(64, joints, 1)

    def forward(self, img):
        return self.final(self.stem(img))


class EpochBasedRunner:
    def __init__(self, model, optimizer, work_dir, max_epochs, logger):
        self.model = model
        self.optimizer = optimizer
        self.work_dir = work_dir
        self.logger = logger
        self.rank, self.world_size = get_dist_info()
        self._epoch = 0
        self._iter = 0
        self._max_epochs = max_epochs

    def train(self, data_loader):
        self.model.train()
        for i, (img, target) in enumerate(data_loader):
            img = img.cuda(non_blocking=True)
            target = target.cuda(non_blocking=True)
            loss = F.mse_loss(self.model(img), target)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self._iter += 1
            if self.rank == 0 and self._iter % 50 == 0:
                self.logger.info("Epoch [%d][%d/%d] heatmap_loss: %.6f", self._epoch + 1, i + 1, len(data_loader),
                                 loss.item())
        self._epoch += 1

    def save_checkpoint(self):
        if self.rank == 0:
            filename = osp.join(self.work_dir, f"epoch_{self._epoch}.pth")
            torch.save({"state_dict": self.model.module.state_dict(), "epoch": self._epoch}, filename)

    def run(self, data_loader):
        while self._epoch < self._max_epochs:  # planted: PT005
            self.train(data_loader)
            self.save_checkpoint()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--work-dir", default="work_dirs/simple_baseline")
    parser.add_argument("--total-epochs", type=int, default=210)
    parser.add_argument("--samples-per-gpu", type=int, default=64)
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    rank, world_size = get_dist_info()
    logging.basicConfig(level=logging.INFO)
    logger = logging.getLogger("mmpose")

    dataset = KeypointDataset()
    sampler = DistributedSampler(dataset, world_size, rank)
    loader = DataLoader(dataset, batch_size=args.samples_per_gpu, sampler=sampler, num_workers=4, pin_memory=True)

    model = DistributedDataParallel(SimpleBaseline().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
    runner = EpochBasedRunner(model, optimizer, args.work_dir, args.total_epochs, logger)
    runner.run(loader)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
