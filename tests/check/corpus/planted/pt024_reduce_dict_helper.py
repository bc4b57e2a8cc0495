"""Detection training loop in the torchvision-references shape, with a reduce_loss_dict helper.

Planted: PT024 - reduce_loss_dict all-reduces the per-rank mean losses with SUM and never divides by the world size before they are logged
"""
import math
import os
import sys

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from det_data import CocoDetection, collate_fn, get_transform


def reduce_loss_dict(loss_dict):
    """Reduce the loss dict over all ranks so that rank 0 logs global values."""
    with torch.no_grad():
        names = sorted(loss_dict.keys())
        values = torch.stack([loss_dict[k] for k in names])
        dist.all_reduce(values)  # planted: PT024
        return {k: v for k, v in zip(names, values)}


def train_one_epoch(model, optimizer, data_loader, device, epoch, print_freq, rank):
    model.train()
    data_loader.sampler.set_epoch(epoch)
    for i, (images, targets) in enumerate(data_loader):
        images = [img.to(device) for img in images]
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        loss_dict = model(images, targets)
        losses = sum(loss for loss in loss_dict.values())

        loss_dict_reduced = reduce_loss_dict(loss_dict)
        losses_reduced = sum(loss for loss in loss_dict_reduced.values())
        loss_value = losses_reduced.item()
        if not math.isfinite(loss_value):
            sys.exit(1)

        optimizer.zero_grad()
        losses.backward()
        optimizer.step()

        if i % print_freq == 0 and rank == 0:
            parts = "  ".join(f"{k}: {v.item():.4f}" for k, v in loss_dict_reduced.items())
            print(f"Epoch: [{epoch}] [{i}/{len(data_loader)}]  loss: {loss_value:.4f}  {parts}")


def main():
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    dataset = CocoDetection("/data/coco", "train", get_transform(train=True))
    sampler = DistributedSampler(dataset)
    data_loader = DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=4, collate_fn=collate_fn)

    model = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, num_classes=91)
    model.to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank])
    model_without_ddp = model.module
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.02, momentum=0.9, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[16, 22], gamma=0.1)

    for epoch in range(26):
        train_one_epoch(model, optimizer, data_loader, device, epoch, 20, rank)
        lr_scheduler.step()
        if rank == 0:
            torch.save({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                        "lr_scheduler": lr_scheduler.state_dict(), "epoch": epoch},
                       os.path.join("output", f"model_{epoch}.pth"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
