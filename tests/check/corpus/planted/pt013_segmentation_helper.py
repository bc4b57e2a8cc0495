"""Semantic segmentation training (DeepLab-style) on all visible GPUs of one machine.

Planted: PT013 - build_model() converts BatchNorm to SyncBatchNorm; main() wraps the result in DataParallel
"""
import argparse
import logging

import torch
from torch.nn import CrossEntropyLoss, DataParallel, SyncBatchNorm
from torch.utils.data import DataLoader
from torchvision.models.segmentation import deeplabv3_resnet50

from seg_data import VOCSegmentation

logger = logging.getLogger(__name__)


def build_model(num_classes, use_sync_bn):
    net = deeplabv3_resnet50(weights=None, num_classes=num_classes, aux_loss=True)
    if use_sync_bn:
        net = SyncBatchNorm.convert_sync_batchnorm(net)  # planted: PT013
    return net


def criterion(outputs, target):
    loss_fn = CrossEntropyLoss(ignore_index=255)
    losses = {name: loss_fn(x, target) for name, x in outputs.items()}
    return losses["out"] + 0.5 * losses["aux"]


def train_one_epoch(model, optimizer, lr_scheduler, loader, device, epoch):
    model.train()
    for it, batch in enumerate(loader):
        image = batch["image"].to(device, non_blocking=True)
        target = batch["mask"].to(device, non_blocking=True)
        loss = criterion(model(image), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        lr_scheduler.step()
        if it % 20 == 0:
            logger.info("epoch %d iter %d loss %.4f lr %.6f", epoch, it, loss.item(),
                        optimizer.param_groups[0]["lr"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-root", default="./VOCdevkit")
    parser.add_argument("--gpus", default="0,1,2,3")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--sync-bn", action="store_true")
    parser.add_argument("--out", default="deeplab.pth")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    gpu_ids = [int(g) for g in args.gpus.split(",")]
    device = torch.device("cuda", gpu_ids[0])

    dataset = VOCSegmentation(args.data_root, split="train")
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=8, drop_last=True)

    model = build_model(21, args.sync_bn)
    model = DataParallel(model, device_ids=gpu_ids, output_device=gpu_ids[0])
    model.to(device)

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=1e-4)
    total_iters = len(loader) * args.epochs
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda x: (1 - x / total_iters) ** 0.9)

    for epoch in range(args.epochs):
        train_one_epoch(model, optimizer, lr_scheduler, loader, device, epoch)
        torch.save(model.module.state_dict(), args.out)


if __name__ == "__main__":
    main()
