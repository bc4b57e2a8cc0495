"""Object-detection-style Trainer that accumulates gradients and skips DDP sync on non-final micro-batches.

Planted: PT019 - Trainer.train_step backpropagates the summed loss dict undivided; the step happens every self.grad_accum
"""
import logging
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision.models.detection import fasterrcnn_resnet50_fpn

from coco_data import CocoDetection, collate_fn

logger = logging.getLogger(__name__)


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.local_rank)
        dist.init_process_group(backend="nccl")
        self.rank = dist.get_rank()
        self.device = torch.device("cuda", self.local_rank)
        self.grad_accum = cfg["grad_accum"]
        model = fasterrcnn_resnet50_fpn(weights=None, num_classes=91).to(self.device)
        self.model = DDP(model, device_ids=[self.local_rank])
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.SGD(params, lr=cfg["lr"], momentum=0.9, weight_decay=1e-4)
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(self.optimizer, milestones=[16, 22], gamma=0.1)
        dataset = CocoDetection(cfg["data"], "train2017")
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=cfg["batch_size"], sampler=self.sampler,
                                 collate_fn=collate_fn, num_workers=4)

    def train_step(self, it, images, targets):
        sync = (it + 1) % self.grad_accum == 0
        ctx = self.model.no_sync() if not sync else nullcontext()
        with ctx:
            loss_dict = self.model(images, targets)
            losses = sum(loss for loss in loss_dict.values())
            losses.backward()  # planted: PT019
        if sync:
            self.optimizer.step()
            self.optimizer.zero_grad()
        return losses.item()

    def train_epoch(self, epoch):
        self.model.train()
        self.sampler.set_epoch(epoch)
        for it, (images, targets) in enumerate(self.loader):
            images = [img.to(self.device, non_blocking=True) for img in images]
            targets = [{k: v.to(self.device) for k, v in t.items()} for t in targets]
            loss = self.train_step(it, images, targets)
            if self.rank == 0 and it % 50 == 0:
                logger.info("epoch %d iter %d loss %.4f", epoch, it, loss)

    def fit(self):
        for epoch in range(self.cfg["epochs"]):
            self.train_epoch(epoch)
            self.scheduler.step()
            if self.rank == 0:
                torch.save({"model": self.model.module.state_dict(), "epoch": epoch},
                           os.path.join(self.cfg["out"], "model_final.pth"))
        dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    Trainer({"data": "/data/coco", "epochs": 26, "batch_size": 2, "grad_accum": 4,
             "lr": 0.02, "out": "./frcnn"}).fit()
