"""Iteration-based semantic segmentation training (mmseg schedule_80k shape) with DDP.

torchrun --nproc_per_node=4 train_seg.py --work-dir work_dirs/fcn
Planted: PT010 - the checkpoint torch.save is guarded only by the iteration interval, not by rank
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

logger = logging.getLogger("mmseg")


class CityscapesLike(Dataset):
    def __init__(self, n=2975, num_classes=19):
        self.n, self.num_classes = n, num_classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.randn(3, 256, 512), torch.randint(0, self.num_classes, (256, 512))


class FCNHead(nn.Module):
    def __init__(self, num_classes=19):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.Conv2d(64, 128, 3, 2, 1), nn.BatchNorm2d(128), nn.ReLU())
        self.conv_seg = nn.Conv2d(128, num_classes, 1)

    def forward(self, img):
        out = self.conv_seg(self.backbone(img))
        return F.interpolate(out, size=img.shape[-2:], mode="bilinear", align_corners=False)


def poly_lr(optimizer, base_lr, it, max_iters, power=0.9, min_lr=1e-4):
    lr = (base_lr - min_lr) * (1 - it / max_iters) ** power + min_lr
    for group in optimizer.param_groups:
        group["lr"] = lr


def main(cfg):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    rank = dist.get_rank()

    dataset = CityscapesLike()
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=cfg.samples_per_gpu, sampler=sampler, num_workers=4, drop_last=True)

    model = nn.SyncBatchNorm.convert_sync_batchnorm(FCNHead()).cuda()
    model = DistributedDataParallel(model, device_ids=[local_rank], find_unused_parameters=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=5e-4)

    it, epoch = 0, 0
    while it < cfg.max_iters:
        sampler.set_epoch(epoch)
        for img, gt_semantic_seg in loader:
            img = img.cuda(non_blocking=True)
            gt_semantic_seg = gt_semantic_seg.cuda(non_blocking=True)
            poly_lr(optimizer, cfg.lr, it, cfg.max_iters)
            loss = F.cross_entropy(model(img), gt_semantic_seg, ignore_index=255)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            it += 1
            if rank == 0 and it % 50 == 0:
                logger.info("Iter [%d/%d] lr: %.4e, decode.loss_ce: %.4f", it, cfg.max_iters,
                            optimizer.param_groups[0]["lr"], loss.item())
            if it % cfg.checkpoint_interval == 0:
                torch.save({"meta": {"iter": it}, "state_dict": model.module.state_dict()}, osp.join(cfg.work_dir, f"iter_{it}.pth"))  # planted: PT010
            if it >= cfg.max_iters:
                break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--work-dir", default="work_dirs/fcn")
    parser.add_argument("--samples-per-gpu", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--max-iters", type=int, default=80000)
    parser.add_argument("--checkpoint-interval", type=int, default=8000)
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())
