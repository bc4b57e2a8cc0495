"""Semantic segmentation training driven by a config dict, single process over several GPUs.

Planted: PT013 - build_segmentor() converts to SyncBatchNorm (norm="SyncBN" in the config) but the model runs under nn.DataParallel
"""
import logging
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

logger = logging.getLogger("seg")

cfg = dict(
    model=dict(num_classes=19, channels=64, norm="SyncBN"),
    data=dict(samples_per_gpu=4, workers_per_gpu=2),
    gpu_ids=[0, 1, 2, 3],
    optimizer=dict(lr=0.01, momentum=0.9, weight_decay=5e-4),
    total_epochs=40,
    work_dir="work_dirs/fcn_r18_512x1024",
)


def conv_bn_relu(cin, cout, stride=1):
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class FCN(nn.Module):
    def __init__(self, num_classes, channels):
        super().__init__()
        self.backbone = nn.Sequential(
            conv_bn_relu(3, channels, 2), conv_bn_relu(channels, channels),
            conv_bn_relu(channels, channels * 2, 2), conv_bn_relu(channels * 2, channels * 2),
        )
        self.decode_head = nn.Sequential(conv_bn_relu(channels * 2, channels), nn.Conv2d(channels, num_classes, 1))

    def forward(self, img):
        out = self.decode_head(self.backbone(img))
        return F.interpolate(out, size=img.shape[-2:], mode="bilinear", align_corners=False)


def build_segmentor(model_cfg):
    net = FCN(model_cfg["num_classes"], model_cfg["channels"])
    if model_cfg["norm"] == "SyncBN":
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)  # planted: PT013
    return net


def build_dataloader(data_cfg, num_gpus):
    images = torch.randn(256, 3, 128, 256)
    masks = torch.randint(0, 19, (256, 128, 256))
    return DataLoader(TensorDataset(images, masks), batch_size=data_cfg["samples_per_gpu"] * num_gpus,
                      shuffle=True, num_workers=data_cfg["workers_per_gpu"] * num_gpus, drop_last=True)


def main():
    logging.basicConfig(level=logging.INFO)
    os.makedirs(cfg["work_dir"], exist_ok=True)
    model = build_segmentor(cfg["model"]).cuda()
    model = nn.DataParallel(model, device_ids=cfg["gpu_ids"])
    loader = build_dataloader(cfg["data"], len(cfg["gpu_ids"]))
    optimizer = torch.optim.SGD(model.parameters(), **cfg["optimizer"])
    max_iters = cfg["total_epochs"] * len(loader)
    scheduler = torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=max_iters, power=0.9)

    it = 0
    for epoch in range(cfg["total_epochs"]):
        model.train()
        for img, mask in loader:
            img = img.cuda(non_blocking=True)
            mask = mask.cuda(non_blocking=True)
            loss = F.cross_entropy(model(img), mask, ignore_index=255)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            it += 1
            if it % 50 == 0:
                logger.info("Epoch [%d] Iter [%d/%d] loss: %.4f", epoch + 1, it, max_iters, loss.item())
        torch.save({"meta": {"epoch": epoch + 1, "iter": it}, "state_dict": model.module.state_dict()},
                   os.path.join(cfg["work_dir"], "latest.pth"))


if __name__ == "__main__":
    main()
