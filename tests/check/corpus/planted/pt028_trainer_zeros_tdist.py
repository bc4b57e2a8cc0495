"""Object-tracking re-ID Trainer with a _sync_stats helper; torch.distributed imported as tdist.

Planted: PT028 - _sync_stats fills torch.zeros(3, dtype=torch.float64) (no device, so CPU) and tdist.all_reduce()s it under nccl
"""
import logging
import os

import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from reid import Market1501, ReIDResNet, TripletLoss

logger = logging.getLogger("reid")


class Trainer:
    def __init__(self, model, loader, num_epochs):
        self.rank = tdist.get_rank()
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.model = DDP(model.to(self.device), device_ids=[self.local_rank])
        self.loader = loader
        self.num_epochs = num_epochs
        self.id_loss = nn.CrossEntropyLoss(label_smoothing=0.1)
        self.tri_loss = TripletLoss(margin=0.3)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=3.5e-4, weight_decay=5e-4)
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(self.optimizer, [40, 70], 0.1)

    def _sync_stats(self, loss_sum, correct, count):
        stats = torch.zeros(3, dtype=torch.float64)
        stats[0] = loss_sum
        stats[1] = correct
        stats[2] = count
        tdist.all_reduce(stats)  # planted: PT028
        return stats[0].item() / stats[2].item(), stats[1].item() / stats[2].item()

    def _train_epoch(self, epoch):
        self.loader.sampler.set_epoch(epoch)
        self.model.train()
        loss_sum, correct, count = 0.0, 0, 0
        for imgs, pids in self.loader:
            imgs = imgs.to(self.device, non_blocking=True)
            pids = pids.to(self.device, non_blocking=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                feats, logits = self.model(imgs)
                loss = self.id_loss(logits, pids) + self.tri_loss(feats, pids)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            loss_sum += loss.item() * pids.size(0)
            correct += (logits.argmax(1) == pids).sum().item()
            count += pids.size(0)
        return self._sync_stats(loss_sum, correct, count)

    def train(self):
        for epoch in range(self.num_epochs):
            loss, acc = self._train_epoch(epoch)
            self.scheduler.step()
            if self.rank == 0:
                logger.info("epoch %d loss %.4f id-acc %.4f", epoch, loss, acc)
                torch.save(self.model.module.state_dict(), "reid_r50_last.pth")


def main():
    logging.basicConfig(level=logging.INFO)
    tdist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dataset = Market1501("/data/market1501", split="train")
    loader = DataLoader(dataset, batch_size=64, sampler=DistributedSampler(dataset), num_workers=8,
                        drop_last=True)
    Trainer(ReIDResNet(num_classes=dataset.num_pids), loader, num_epochs=120).train()
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
