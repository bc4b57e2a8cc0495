"""Binary segmentation (small U-Net) on image/mask pairs with DDP.

torchrun --nproc_per_node=4 train_unet.py
Planted: PT004 - DL(...) given both shuffle=True and sampler=train_sampler
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader as DL
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler


class MaskDataset(Dataset):
    def __init__(self, n=3000, size=128):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        img = torch.rand(3, self.size, self.size)
        mask = (img.mean(0, keepdim=True) > 0.5).float()
        return img, mask


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc1, self.enc2 = block(3, 32), block(32, 64)
        self.bott = block(64, 128)
        self.up2, self.dec2 = nn.ConvTranspose2d(128, 64, 2, 2), block(128, 64)
        self.up1, self.dec1 = nn.ConvTranspose2d(64, 32, 2, 2), block(64, 32)
        self.out = nn.Conv2d(32, 1, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        b = self.bott(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(b), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.out(d1)


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)

    train_set = MaskDataset()
    train_sampler = DistributedSampler(train_set)
    train_loader = DL(train_set, batch_size=8, shuffle=True, sampler=train_sampler, num_workers=4)  # planted: PT004

    model = UNet().cuda(local_rank)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)

    for epoch in range(30):
        train_sampler.set_epoch(epoch)
        model.train()
        for step, (img, mask) in enumerate(train_loader):
            img, mask = img.cuda(local_rank, non_blocking=True), mask.cuda(local_rank, non_blocking=True)
            loss = F.binary_cross_entropy_with_logits(model(img), mask)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if dist.get_rank() == 0 and step % 100 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), f"unet_epoch{epoch}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
