"""Detector training in the mmdet 2.x layout (build_dataloader / train_detector), no mmcv.

python -m torch.distributed.launch --nproc_per_node=8 --use_env train_det.py --work-dir work_dirs/retina
Planted: PT004 - build_dataloader's shuffle=True default is passed to DataLoader together with sampler=
"""
import argparse
import logging
import os
import os.path as osp

import torch
import torch.distributed as torch_dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("mmdet")


def get_dist_info():
    if torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_rank(), torch_dist.get_world_size()
    return 0, 1


class CocoLikeDataset(Dataset):
    def __init__(self, num_images=10000, num_classes=80):
        self.num_images, self.num_classes = num_images, num_classes

    def __len__(self):
        return self.num_images

    def __getitem__(self, idx):
        img = torch.randn(3, 320, 320)
        gt_label = torch.randint(0, self.num_classes, ())
        gt_bbox = torch.rand(4)
        return img, gt_bbox, gt_label


class SingleStageDetector(nn.Module):
    def __init__(self, num_classes=80):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.cls_head = nn.Linear(64, num_classes)
        self.reg_head = nn.Linear(64, 4)

    def forward(self, img, gt_bbox, gt_label):
        feat = self.backbone(img)
        loss_cls = F.cross_entropy(self.cls_head(feat), gt_label)
        loss_bbox = F.l1_loss(self.reg_head(feat).sigmoid(), gt_bbox)
        return dict(loss_cls=loss_cls, loss_bbox=loss_bbox)


def build_dataloader(dataset, samples_per_gpu, workers_per_gpu, num_gpus=1, distributed=True, shuffle=True,
                     seed=None, **kwargs):
    rank, world_size = get_dist_info()
    if distributed:
        sampler = DistributedSampler(dataset, world_size, rank, shuffle=shuffle, seed=seed or 0)
        batch_size = samples_per_gpu
        num_workers = workers_per_gpu
    else:
        sampler = None
        batch_size = num_gpus * samples_per_gpu
        num_workers = num_gpus * workers_per_gpu
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers, shuffle=shuffle, pin_memory=False, **kwargs)  # planted: PT004


def train_detector(model, dataset, cfg):
    rank, _ = get_dist_info()
    data_loader = build_dataloader(dataset, cfg.samples_per_gpu, cfg.workers_per_gpu, seed=cfg.seed, drop_last=True)
    local_rank = int(os.environ["LOCAL_RANK"])
    model = DistributedDataParallel(model.cuda(), device_ids=[local_rank], broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=1e-4)

    for epoch in range(cfg.max_epochs):
        data_loader.sampler.set_epoch(epoch)
        model.train()
        for i, (img, gt_bbox, gt_label) in enumerate(data_loader):
            img = img.cuda(non_blocking=True)
            gt_bbox = gt_bbox.cuda(non_blocking=True)
            gt_label = gt_label.cuda(non_blocking=True)
            losses = model(img, gt_bbox, gt_label)
            loss = sum(losses.values())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0 and i % 50 == 0:
                logger.info("Epoch [%d][%d/%d] %s", epoch + 1, i, len(data_loader),
                            ", ".join(f"{k}: {v.item():.4f}" for k, v in losses.items()))
        if rank == 0:
            torch.save({"meta": {"epoch": epoch + 1}, "state_dict": model.module.state_dict()},
                       osp.join(cfg.work_dir, f"epoch_{epoch + 1}.pth"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--work-dir", default="work_dirs/retina")
    parser.add_argument("--samples-per-gpu", type=int, default=2)
    parser.add_argument("--workers-per-gpu", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--max-epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=42)
    cfg = parser.parse_args()
    torch_dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    logging.basicConfig(level=logging.INFO)
    train_detector(SingleStageDetector(), CocoLikeDataset(), cfg)
    torch_dist.destroy_process_group()


if __name__ == "__main__":
    main()
