"""Point-cloud classifier (PointNet++) Trainer with OneCycleLR and gradient accumulation.

Planted: PT027 - _train_epoch calls self.sched.step() after every micro-batch, while the optimizer only steps every self.accum micro-batches
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import OneCycleLR
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from pointnet2 import ModelNet40, PointNet2Cls


class Trainer:
    def __init__(self, model, loader, epochs, accum=2, max_lr=1e-3):
        self.rank = dist.get_rank()
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.model = DDP(model.to(self.device), device_ids=[self.local_rank])
        self.loader = loader
        self.epochs = epochs
        self.accum = accum
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=max_lr, weight_decay=1e-2)
        steps_per_epoch = len(loader) // accum
        self.sched = OneCycleLR(self.opt, max_lr=max_lr, epochs=epochs, steps_per_epoch=steps_per_epoch)

    def _micro_batch(self, points, labels):
        logits = self.model(points)
        loss = F.cross_entropy(logits, labels, label_smoothing=0.2)
        (loss / self.accum).backward()
        correct = (logits.argmax(-1) == labels).sum()
        return loss.detach(), correct

    def _train_epoch(self, epoch):
        self.loader.sampler.set_epoch(epoch)
        self.model.train()
        stats = torch.zeros(3, device=self.device)
        for it, (points, labels) in enumerate(self.loader):
            points = points.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
            loss, correct = self._micro_batch(points, labels)
            if (it + 1) % self.accum == 0:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            self.sched.step()  # planted: PT027
            stats[0] += loss * labels.size(0)
            stats[1] += correct
            stats[2] += labels.size(0)
        dist.all_reduce(stats)
        return (stats[0] / stats[2]).item(), (stats[1] / stats[2]).item()

    def run(self):
        for epoch in range(self.epochs):
            loss, acc = self._train_epoch(epoch)
            if self.rank == 0:
                print(f"epoch {epoch}: loss {loss:.4f} train acc {acc:.4f}")
                torch.save({"model": self.model.module.state_dict(), "opt": self.opt.state_dict(),
                            "sched": self.sched.state_dict(), "epoch": epoch}, "pointnet2_last.pt")


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dataset = ModelNet40("/data/modelnet40_normal_resampled", split="train", npoints=1024)
    loader = DataLoader(dataset, batch_size=24, sampler=DistributedSampler(dataset), num_workers=6,
                        drop_last=True)
    Trainer(PointNet2Cls(num_classes=40), loader, epochs=200, accum=2).run()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
