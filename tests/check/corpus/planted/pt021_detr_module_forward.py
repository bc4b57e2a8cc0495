"""Detection engine: train_one_epoch receives the DDP-wrapped model and calls its inner module's forward.

Planted: PT021 - train_one_epoch runs outputs = model.module.forward(samples) on the DDP model during training
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Boxes(Dataset):
    def __len__(self):
        return 2000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 96, 96, generator=g), torch.randint(0, 21, (10,), generator=g), torch.rand(10, 4, generator=g)


class QueryDetector(nn.Module):
    def __init__(self, dim=128, queries=10, classes=21):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dim, 8, 8), nn.Flatten(2))
        self.queries = nn.Parameter(torch.randn(queries, dim))
        self.attn = nn.MultiheadAttention(dim, 8, batch_first=True)
        self.cls = nn.Linear(dim, classes + 1)
        self.box = nn.Linear(dim, 4)

    def forward(self, samples):
        mem = self.stem(samples).transpose(1, 2)
        q = self.queries.unsqueeze(0).expand(samples.size(0), -1, -1)
        hs, _ = self.attn(q, mem, mem)
        return {"pred_logits": self.cls(hs), "pred_boxes": self.box(hs).sigmoid()}


def criterion(outputs, labels, boxes):
    return {"loss_ce": F.cross_entropy(outputs["pred_logits"].flatten(0, 1), labels.flatten()),
            "loss_bbox": F.l1_loss(outputs["pred_boxes"], boxes)}


def train_one_epoch(model, data_loader, optimizer, device, epoch, max_norm=0.1):
    model.train()
    for i, (samples, labels, boxes) in enumerate(data_loader):
        samples, labels, boxes = samples.to(device), labels.to(device), boxes.to(device)
        outputs = model.module.forward(samples)  # planted: PT021
        loss_dict = criterion(outputs, labels, boxes)
        losses = loss_dict["loss_ce"] + 5 * loss_dict["loss_bbox"]
        optimizer.zero_grad()
        losses.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        if i % 50 == 0 and dist.get_rank() == 0:
            print(f"Epoch [{epoch}] it {i} loss_ce {loss_dict['loss_ce'].item():.3f} "
                  f"loss_bbox {loss_dict['loss_bbox'].item():.3f}")


def main():
    dist.init_process_group("nccl")
    gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(gpu)
    device = torch.device("cuda", gpu)

    model = DistributedDataParallel(QueryDetector().to(device), device_ids=[gpu])
    model_without_ddp = model.module
    param_dicts = [{"params": [p for n, p in model_without_ddp.named_parameters() if "stem" not in n]},
                   {"params": [p for n, p in model_without_ddp.named_parameters() if "stem" in n], "lr": 1e-5}]
    optimizer = torch.optim.AdamW(param_dicts, lr=1e-4, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 100)

    dataset_train = Boxes()
    sampler_train = DistributedSampler(dataset_train)
    data_loader_train = DataLoader(dataset_train, batch_size=8, sampler=sampler_train, drop_last=True)

    for epoch in range(150):
        sampler_train.set_epoch(epoch)
        train_one_epoch(model, data_loader_train, optimizer, device, epoch)
        lr_scheduler.step()
        if dist.get_rank() == 0:
            torch.save({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch}, "outputs/checkpoint.pth")


if __name__ == "__main__":
    main()
