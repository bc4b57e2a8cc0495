"""2D U-Net for organ segmentation on CT slices, trained with torchrun.

Planted: PT002 - `image.to(device)` as a bare statement; the batch stays on the CPU
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.InstanceNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.InstanceNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, n_classes=14, base=32):
        super().__init__()
        self.d1, self.d2, self.d3 = block(1, base), block(base, base * 2), block(base * 2, base * 4)
        self.u2 = nn.ConvTranspose2d(base * 4, base * 2, 2, stride=2)
        self.c2 = block(base * 4, base * 2)
        self.u1 = nn.ConvTranspose2d(base * 2, base, 2, stride=2)
        self.c1 = block(base * 2, base)
        self.out = nn.Conv2d(base, n_classes, 1)

    def forward(self, x):
        x1 = self.d1(x)
        x2 = self.d2(F.max_pool2d(x1, 2))
        x3 = self.d3(F.max_pool2d(x2, 2))
        y = self.c2(torch.cat([self.u2(x3), x2], 1))
        y = self.c1(torch.cat([self.u1(y), x1], 1))
        return self.out(y)


class CTSlices(Dataset):
    def __len__(self):
        return 2000

    def __getitem__(self, i):
        return torch.randn(1, 256, 256), torch.randint(0, 14, (256, 256))


def dice_loss(logits, target, eps=1e-5):
    probs = logits.softmax(1)
    onehot = F.one_hot(target, probs.size(1)).permute(0, 3, 1, 2).float()
    inter = (probs * onehot).sum((2, 3))
    union = probs.sum((2, 3)) + onehot.sum((2, 3))
    return 1 - ((2 * inter + eps) / (union + eps)).mean()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    rank = dist.get_rank()
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    model = UNet().to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=1e-5)

    train_ds = CTSlices()
    sampler = DistributedSampler(train_ds)
    loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler, num_workers=4, pin_memory=True)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        running = torch.zeros(2, device=device)
        for image, label in loader:
            image.to(device)  # planted: PT002
            label = label.to(device)
            logits = model(image)
            loss = F.cross_entropy(logits, label) + dice_loss(logits, label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running += torch.stack([loss.detach(), torch.ones((), device=device)])
        dist.all_reduce(running)
        if rank == 0:
            print(f"epoch {epoch}: loss {(running[0] / running[1]).item():.4f}")
            torch.save({"epoch": epoch, "model": model.module.state_dict()}, "unet_last.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
