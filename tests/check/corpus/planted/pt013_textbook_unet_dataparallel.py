"""Train a 2D U-Net for liver CT slice segmentation on all visible GPUs.

Planted: PT013 - SyncBatchNorm.convert_sync_batchnorm on a model then wrapped in nn.DataParallel
"""
import argparse
import logging
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

logger = logging.getLogger("unet")


class SliceDataset(Dataset):
    def __init__(self, root: Path):
        self.images = sorted((root / "images").glob("*.npy"))
        self.masks = sorted((root / "masks").glob("*.npy"))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        import numpy as np
        img = torch.from_numpy(np.load(self.images[i])).float().unsqueeze(0)
        mask = torch.from_numpy(np.load(self.masks[i])).long()
        return img, mask


def block(cin, cout):
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    def __init__(self, classes=3, base=32):
        super().__init__()
        self.enc1, self.enc2, self.enc3 = block(1, base), block(base, base * 2), block(base * 2, base * 4)
        self.up2 = nn.ConvTranspose2d(base * 4, base * 2, 2, stride=2)
        self.dec2 = block(base * 4, base * 2)
        self.up1 = nn.ConvTranspose2d(base * 2, base, 2, stride=2)
        self.dec1 = block(base * 2, base)
        self.head = nn.Conv2d(base, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        e3 = self.enc3(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(e3), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.head(d1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=Path("lits_slices"))
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    loader = DataLoader(SliceDataset(args.root), batch_size=args.batch_size, shuffle=True, num_workers=8)
    model = UNet()
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # planted: PT013
    model = nn.DataParallel(model).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(args.epochs):
        model.train()
        for img, mask in loader:
            img = img.cuda(non_blocking=True)
            mask = mask.cuda(non_blocking=True)
            loss = F.cross_entropy(model(img), mask)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        logger.info("epoch %d loss %.4f", epoch, loss.item())

    torch.save(model.module.state_dict(), "unet_lits.pt")


if __name__ == "__main__":
    main()
