"""Retinal-vessel segmentation Trainer: fit() keeps the best Dice checkpoint, test() restores it first.

Planted: PT026 - test() loads self.best_path on every rank right after fit(), where only rank 0 wrote it, with no barrier
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from vessels import DriveDataset, UNet


def dice_counts(logits, mask):
    pred = (logits.sigmoid() > 0.5).float()
    inter = (pred * mask).sum()
    denom = pred.sum() + mask.sum()
    return inter, denom


class Trainer:
    def __init__(self, model, loaders, out_dir, epochs=200):
        self.rank = dist.get_rank()
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.model = DDP(model.to(self.device), device_ids=[self.local_rank])
        self.train_loader, self.val_loader, self.test_loader = loaders
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=2e-4)
        self.scaler = torch.amp.GradScaler("cuda")
        self.epochs = epochs
        self.best_path = os.path.join(out_dir, "unet_best.pt")
        self.best_dice = 0.0

    def _train_epoch(self, epoch):
        self.train_loader.sampler.set_epoch(epoch)
        self.model.train()
        for image, mask in self.train_loader:
            image = image.to(self.device, non_blocking=True)
            mask = mask.to(self.device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.float16):
                logits = self.model(image)
                loss = F.binary_cross_entropy_with_logits(logits, mask)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()

    @torch.no_grad()
    def _dice(self, loader):
        self.model.eval()
        acc = torch.zeros(2, device=self.device)
        for image, mask in loader:
            image = image.to(self.device, non_blocking=True)
            mask = mask.to(self.device, non_blocking=True)
            inter, denom = dice_counts(self.model(image), mask)
            acc[0] += inter
            acc[1] += denom
        dist.all_reduce(acc)
        return (2 * acc[0] / acc[1].clamp(min=1)).item()

    def fit(self):
        for epoch in range(self.epochs):
            self._train_epoch(epoch)
            dice = self._dice(self.val_loader)
            if dice > self.best_dice:
                self.best_dice = dice
                if self.rank == 0:
                    torch.save({"model": self.model.module.state_dict(), "epoch": epoch}, self.best_path)
            if self.rank == 0:
                print(f"epoch {epoch}: val dice {dice:.4f} (best {self.best_dice:.4f})")

    def test(self):
        ckpt = torch.load(self.best_path, map_location=self.device, weights_only=True)  # planted: PT026
        self.model.module.load_state_dict(ckpt["model"])
        dice = self._dice(self.test_loader)
        if self.rank == 0:
            print(f"test dice of best epoch {ckpt['epoch']}: {dice:.4f}")


def main():
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    splits = [DriveDataset("/data/DRIVE", s) for s in ("train", "val", "test")]
    loaders = (
        DataLoader(splits[0], batch_size=8, sampler=DistributedSampler(splits[0]), num_workers=4),
        DataLoader(splits[1], batch_size=8, sampler=DistributedSampler(splits[1], shuffle=False)),
        DataLoader(splits[2], batch_size=8, sampler=DistributedSampler(splits[2], shuffle=False)),
    )
    trainer = Trainer(UNet(in_channels=3, out_channels=1), loaders, out_dir="runs/drive")
    trainer.fit()
    trainer.test()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
