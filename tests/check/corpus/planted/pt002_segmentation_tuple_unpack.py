"""Semantic segmentation training (torchvision references layout) with DDP and bf16 autocast.

Planted: PT002 - target unpacked from the batch tuple is moved with a bare target.to(device, non_blocking=True).
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from presets import SegmentationPresetTrain


def criterion(inputs, target):
    losses = {name: nn.functional.cross_entropy(x, target, ignore_index=255) for name, x in inputs.items()}
    if len(losses) == 1:
        return losses["out"]
    return losses["out"] + 0.5 * losses["aux"]


def train_one_epoch(model, optimizer, data_loader, lr_scheduler, device, epoch):
    model.train()
    running = torch.zeros(2, device=device)
    for batch in data_loader:
        image, target = batch
        image = image.to(device, non_blocking=True)
        target.to(device, non_blocking=True)  # planted: PT002
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            output = model(image)
            loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        lr_scheduler.step()
        running[0] += loss.detach()
        running[1] += 1
    dist.all_reduce(running)
    return (running[0] / running[1]).item()


def main(args):
    dist.init_process_group(backend="nccl")
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    device = torch.device("cuda")
    rank = dist.get_rank()

    dataset = torchvision.datasets.VOCSegmentation(args.data_path, image_set="train", transforms=SegmentationPresetTrain(base_size=520, crop_size=480))
    train_sampler = DistributedSampler(dataset)
    data_loader = DataLoader(dataset, batch_size=args.batch_size, sampler=train_sampler, num_workers=args.workers, drop_last=True)

    model = torchvision.models.segmentation.fcn_resnet50(num_classes=21, aux_loss=True)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    model_without_ddp = model.module

    params = [p for p in model_without_ddp.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=1e-4)
    iters = len(data_loader) * args.epochs
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda x: (1 - x / iters) ** 0.9)

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        mean_loss = train_one_epoch(model, optimizer, data_loader, lr_scheduler, device, epoch)
        if rank == 0:
            print(f"epoch {epoch}: loss {mean_loss:.4f}")
            checkpoint = {"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(checkpoint, os.path.join(args.output_dir, "checkpoint.pth"))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-path", default="/datasets01/VOC")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--output-dir", default=".")
    main(parser.parse_args())
