"""Video action recognition training with an mmaction-style runner (no mmcv).

Launch with: torchrun --nnodes=2 --nproc_per_node=8 train_recognizer.py ann_train.txt work_dirs/tsn
Planted: PT001 - global rank from the get_dist_info() tuple used as the CUDA device
"""
import argparse
import logging
import os.path as osp

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("mmaction")


def get_dist_info():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_dist(backend="nccl"):
    dist.init_process_group(backend=backend)
    rank, world_size = get_dist_info()
    torch.cuda.set_device(rank)  # planted: PT001
    return rank, world_size


class RawFrameDataset(Dataset):
    def __init__(self, ann_file, clip_len=8, num_classes=400):
        with open(ann_file) as f:
            self.video_infos = [line.split() for line in f if line.strip()]
        self.clip_len = clip_len
        self.num_classes = num_classes

    def __len__(self):
        return len(self.video_infos)

    def __getitem__(self, idx):
        _, label = self.video_infos[idx]
        imgs = torch.randn(3, self.clip_len, 112, 112)
        return imgs, int(label) % self.num_classes


class Recognizer3D(nn.Module):
    def __init__(self, num_classes=400):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv3d(3, 64, kernel_size=3, padding=1), nn.BatchNorm3d(64), nn.ReLU(inplace=True),
            nn.Conv3d(64, 128, kernel_size=3, stride=2, padding=1), nn.BatchNorm3d(128), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool3d(1),
        )
        self.cls_head = nn.Linear(128, num_classes)

    def forward(self, imgs):
        return self.cls_head(self.backbone(imgs).flatten(1))


def train_recognizer(args):
    rank, world_size = init_dist()
    dataset = RawFrameDataset(args.ann_file)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    data_loader = DataLoader(dataset, batch_size=args.videos_per_gpu, sampler=sampler,
                             num_workers=args.workers_per_gpu, pin_memory=True, drop_last=True)

    model = Recognizer3D()
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).cuda()
    model = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    lr_config = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[40, 80], gamma=0.1)

    for epoch in range(args.total_epochs):
        sampler.set_epoch(epoch)
        model.train()
        for i, (imgs, labels) in enumerate(data_loader):
            imgs = imgs.cuda(non_blocking=True)
            labels = labels.cuda(non_blocking=True)
            loss = F.cross_entropy(model(imgs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0 and i % args.log_interval == 0:
                logger.info("Epoch [%d][%d/%d] loss_cls: %.4f", epoch + 1, i, len(data_loader), loss.item())
        lr_config.step()
        if rank == 0:
            torch.save({"state_dict": model.module.state_dict(), "epoch": epoch + 1},
                       osp.join(args.work_dir, f"epoch_{epoch + 1}.pth"))
    dist.destroy_process_group()


def parse_args():
    parser = argparse.ArgumentParser(description="Train a recognizer")
    parser.add_argument("ann_file")
    parser.add_argument("work_dir")
    parser.add_argument("--videos-per-gpu", type=int, default=8)
    parser.add_argument("--workers-per-gpu", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--total-epochs", type=int, default=100)
    parser.add_argument("--log-interval", type=int, default=20)
    return parser.parse_args()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    train_recognizer(parse_args())
