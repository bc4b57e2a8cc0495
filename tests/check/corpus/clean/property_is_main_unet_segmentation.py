import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class SyntheticScans(Dataset):
    def __init__(self, n, size=128, classes=4):
        self.n, self.size, self.classes = n, size, classes

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(idx)
        img = torch.randn(1, self.size, self.size, generator=g)
        mask = torch.randint(0, self.classes, (self.size, self.size), generator=g)
        return img, mask


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU())


class UNet(nn.Module):
    def __init__(self, classes=4, w=32):
        super().__init__()
        self.d1, self.d2, self.d3 = block(1, w), block(w, 2 * w), block(2 * w, 4 * w)
        self.u2, self.u1 = block(6 * w, 2 * w), block(3 * w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(F.max_pool2d(a, 2))
        c = self.d3(F.max_pool2d(b, 2))
        b = self.u2(torch.cat([F.interpolate(c, scale_factor=2.0), b], 1))
        a = self.u1(torch.cat([F.interpolate(b, scale_factor=2.0), a], 1))
        return self.head(a)


class SegTrainer:
    def __init__(self, epochs=50, batch_size=8, ckpt_dir="ckpt_unet"):
        dist.init_process_group("nccl")
        self.local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.local_rank)
        self.epochs = epochs
        self.ckpt_dir = Path(ckpt_dir)
        self.net = UNet().to(self.device)
        self.model = DDP(self.net, device_ids=[self.local_rank])
        self.opt = torch.optim.Adam(self.model.parameters(), lr=3e-4)
        train, val = SyntheticScans(2000), SyntheticScans(200)
        self.train_sampler = DistributedSampler(train)
        self.train_loader = DataLoader(train, batch_size=batch_size, sampler=self.train_sampler,
                                       num_workers=4, pin_memory=True)
        self.val_loader = DataLoader(val, batch_size=batch_size,
                                     sampler=DistributedSampler(val, shuffle=False))

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.local_rank)

    def dice_loss(self, logits, mask):
        probs = logits.softmax(1)
        onehot = F.one_hot(mask, probs.shape[1]).permute(0, 3, 1, 2).float()
        inter = (probs * onehot).sum((2, 3))
        denom = probs.sum((2, 3)) + onehot.sum((2, 3))
        return 1 - ((2 * inter + 1) / (denom + 1)).mean()

    def fit_epoch(self, epoch):
        self.train_sampler.set_epoch(epoch)
        self.model.train()
        for img, mask in self.train_loader:
            img = img.to(self.device, non_blocking=True)
            mask = mask.to(self.device, non_blocking=True)
            logits = self.model(img)
            loss = F.cross_entropy(logits, mask) + self.dice_loss(logits, mask)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()

    @torch.no_grad()
    def validate(self):
        self.model.eval()
        inter = torch.zeros(4, device=self.device)
        union = torch.zeros(4, device=self.device)
        for img, mask in self.val_loader:
            img, mask = img.to(self.device), mask.to(self.device)
            pred = self.model(img).argmax(1)
            for c in range(4):
                inter[c] += ((pred == c) & (mask == c)).sum()
                union[c] += ((pred == c) | (mask == c)).sum()
        dist.all_reduce(inter)
        dist.all_reduce(union)
        return (inter / union.clamp(min=1)).mean().item()

    def save(self, epoch, miou):
        if not self.is_main:
            return
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"epoch": epoch, "miou": miou, "model": self.net.state_dict()},
                   self.ckpt_dir / f"unet_{epoch:03d}.pt")

    def run(self):
        for epoch in range(self.epochs):
            self.fit_epoch(epoch)
            miou = self.validate()
            if self.is_main:
                print(f"epoch {epoch} mIoU {miou:.4f}")
            self.save(epoch, miou)
        dist.destroy_process_group()


if __name__ == "__main__":
    SegTrainer().run()
