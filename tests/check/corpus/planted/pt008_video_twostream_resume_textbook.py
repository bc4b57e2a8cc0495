"""Action recognition with a two-pathway (slow/fast) 3D CNN, resumable, launched with torchrun.

Planted: PT008 - the resume checkpoint is read with torch.load(..., map_location="cpu") and no weights_only=
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

NUM_CLASSES = 400


class Clips(Dataset):
    def __len__(self):
        return 240_000

    def __getitem__(self, i):
        return torch.rand(3, 32, 112, 112), i % NUM_CLASSES


class TwoPathway(nn.Module):
    def __init__(self, alpha=8):
        super().__init__()
        self.alpha = alpha
        self.slow = nn.Sequential(nn.Conv3d(3, 64, (1, 7, 7), (1, 2, 2), (0, 3, 3)), nn.BatchNorm3d(64), nn.ReLU(),
                                  nn.AdaptiveAvgPool3d(1), nn.Flatten())
        self.fast = nn.Sequential(nn.Conv3d(3, 8, (5, 7, 7), (1, 2, 2), (2, 3, 3)), nn.BatchNorm3d(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool3d(1), nn.Flatten())
        self.fc = nn.Linear(64 + 8, NUM_CLASSES)

    def forward(self, clip):
        slow_in = clip[:, :, :: self.alpha]
        return self.fc(torch.cat([self.slow(slow_in), self.fast(clip)], 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=196)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--resume", default="")
    ap.add_argument("--output-dir", default="work_dirs/two_pathway")
    args = ap.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    model = TwoPathway().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    start_epoch = 0
    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu")  # planted: PT008
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        start_epoch = checkpoint["epoch"] + 1
    model = DDP(model, device_ids=[local_rank])

    dataset = Clips()
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=8, pin_memory=True)

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        top1 = torch.zeros(2, device=device)
        for clips, labels in loader:
            clips = clips.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            logits = model(clips)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            top1 += torch.stack([(logits.argmax(1) == labels).sum().float(),
                                 torch.tensor(float(labels.size(0)), device=device)])
        scheduler.step()
        dist.all_reduce(top1)
        if dist.get_rank() == 0:
            print(f"epoch {epoch} train top1 {(top1[0] / top1[1]).item():.4f}")
            os.makedirs(args.output_dir, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "epoch": epoch},
                       os.path.join(args.output_dir, "checkpoint.pth"))

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
