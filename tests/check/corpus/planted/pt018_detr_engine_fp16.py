"""Set-prediction detector training: engine-style train_one_epoch(model, criterion, data_loader, ...).

Planted: PT018 - float16 autocast around the forward, losses.backward() with no GradScaler anywhere
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class ToyDetection(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(idx)
        n = int(torch.randint(1, 6, (1,), generator=g))
        return torch.rand(3, 128, 128, generator=g), {"labels": torch.randint(0, 91, (n,), generator=g),
                                                      "boxes": torch.rand(n, 4, generator=g)}


def collate_fn(batch):
    imgs, targets = zip(*batch)
    return torch.stack(imgs), list(targets)


class TinyDETR(nn.Module):
    def __init__(self, num_queries=20, num_classes=91, dim=128):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, dim, 16, 16), nn.Flatten(2))
        self.query = nn.Embedding(num_queries, dim)
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(dim, 8, batch_first=True), 2)
        self.class_embed = nn.Linear(dim, num_classes + 1)
        self.bbox_embed = nn.Linear(dim, 4)

    def forward(self, samples):
        memory = self.backbone(samples).transpose(1, 2)
        hs = self.decoder(self.query.weight.unsqueeze(0).expand(samples.size(0), -1, -1), memory)
        return {"pred_logits": self.class_embed(hs), "pred_boxes": self.bbox_embed(hs).sigmoid()}


class SetCriterion(nn.Module):
    def forward(self, outputs, targets):
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        tgt_cls = torch.full(logits.shape[:2], logits.size(-1) - 1, dtype=torch.long, device=logits.device)
        l1 = []
        for b, t in enumerate(targets):
            n = t["labels"].numel()
            tgt_cls[b, :n] = t["labels"]
            l1.append(F.l1_loss(boxes[b, :n], t["boxes"], reduction="sum"))
        return {"loss_ce": F.cross_entropy(logits.transpose(1, 2), tgt_cls), "loss_bbox": torch.stack(l1).mean()}


def train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, max_norm=0.1):
    model.train()
    weight_dict = {"loss_ce": 1.0, "loss_bbox": 5.0}
    for it, (samples, targets) in enumerate(data_loader):
        samples = samples.to(device)
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        with torch.autocast(device_type="cuda", dtype=torch.float16):  # planted: PT018
            outputs = model(samples)
            loss_dict = criterion(outputs, targets)
            losses = sum(loss_dict[k] * weight_dict[k] for k in loss_dict)
        optimizer.zero_grad()
        losses.backward()
        if max_norm > 0:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        if it % 20 == 0 and dist.get_rank() == 0:
            print(f"Epoch: [{epoch}] [{it}/{len(data_loader)}] loss: {losses.item():.4f}")


def main():
    dist.init_process_group(backend="nccl", init_method="env://")
    gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(gpu)
    device = torch.device("cuda")
    model = TinyDETR().to(device)
    model = DistributedDataParallel(model, device_ids=[gpu])
    model_without_ddp = model.module
    criterion = SetCriterion()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 200)

    dataset_train = ToyDetection()
    sampler_train = DistributedSampler(dataset_train)
    batch_sampler_train = torch.utils.data.BatchSampler(sampler_train, 4, drop_last=True)
    data_loader_train = DataLoader(dataset_train, batch_sampler=batch_sampler_train, collate_fn=collate_fn)

    for epoch in range(300):
        sampler_train.set_epoch(epoch)
        train_one_epoch(model, criterion, data_loader_train, optimizer, device, epoch)
        lr_scheduler.step()
        if dist.get_rank() == 0:
            torch.save({"model": model_without_ddp.state_dict(), "epoch": epoch}, "output/checkpoint.pth")


if __name__ == "__main__":
    main()
