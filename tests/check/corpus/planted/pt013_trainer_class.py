"""Class-based detector-backbone pretraining on one node, batch split across GPUs.

Planted: PT013 - the Trainer wraps a SyncBatchNorm-converted network in nn.DataParallel
"""
import logging
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader

logger = logging.getLogger("trainer")


@dataclass
class Config:
    data_dir: str = "./imagenet100"
    epochs: int = 100
    batch_size: int = 256
    lr: float = 0.2
    workers: int = 16
    ckpt: str = "backbone.pth"


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.device = torch.device("cuda")
        net = torchvision.models.resnet50(num_classes=100)
        self.model = nn.DataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(net)).to(self.device)  # planted: PT013
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=0.9,
                                         weight_decay=1e-4, nesterov=True)
        self.start_epoch = 0
        if os.path.isfile(cfg.ckpt):
            self.load(cfg.ckpt)

    def build_loader(self):
        tfm = torchvision.transforms.Compose([
            torchvision.transforms.RandomResizedCrop(224),
            torchvision.transforms.RandomHorizontalFlip(),
            torchvision.transforms.ToTensor(),
        ])
        ds = torchvision.datasets.ImageFolder(os.path.join(self.cfg.data_dir, "train"), tfm)
        return DataLoader(ds, batch_size=self.cfg.batch_size, shuffle=True,
                          num_workers=self.cfg.workers, pin_memory=True, drop_last=True)

    def load(self, path):
        ckpt = torch.load(path, map_location=self.device, weights_only=True)
        self.model.module.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.start_epoch = ckpt["epoch"] + 1

    def save(self, epoch):
        torch.save({"model": self.model.module.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "epoch": epoch}, self.cfg.ckpt)

    def train_epoch(self, loader, epoch):
        self.model.train()
        for i, (x, y) in enumerate(loader):
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            loss = F.cross_entropy(self.model(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            if i % 100 == 0:
                logger.info("epoch %d it %d loss %.4f", epoch, i, loss.item())

    def fit(self):
        loader = self.build_loader()
        for epoch in range(self.start_epoch, self.cfg.epochs):
            self.train_epoch(loader, epoch)
            self.save(epoch)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    Trainer(Config()).fit()
