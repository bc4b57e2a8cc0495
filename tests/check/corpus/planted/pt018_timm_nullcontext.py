"""timm-like training script where --amp is meant to turn on mixed precision.

Planted: PT018 - with --amp a GradScaler is created and used, but amp_autocast stays nullcontext: no autocast anywhere
"""
import argparse
import logging
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from timm import create_model
from timm.data import create_dataset, create_loader
from torch.nn.parallel import DistributedDataParallel as NativeDDP

_logger = logging.getLogger("train")


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, amp_autocast=nullcontext, loss_scaler=None):
    model.train()
    for batch_idx, (input, target) in enumerate(loader):
        input = input.to(args.device)
        target = target.to(args.device)
        with amp_autocast():
            output = model(input)
            loss = loss_fn(output, target)
        optimizer.zero_grad()
        if loss_scaler is not None:
            loss_scaler.scale(loss).backward()
            loss_scaler.step(optimizer)
            loss_scaler.update()
        else:
            loss.backward()
            optimizer.step()
        if args.rank == 0 and batch_idx % args.log_interval == 0:
            _logger.info("Train: %d [%4d/%d] Loss: %.4f", epoch, batch_idx, len(loader), loss.item())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("-b", "--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--log-interval", type=int, default=50)
    parser.add_argument("--output", default="./output")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    args.local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    args.rank = dist.get_rank()
    args.world_size = dist.get_world_size()
    args.device = torch.device("cuda", args.local_rank)

    model = create_model(args.model, num_classes=1000).to(args.device)

    amp_autocast = nullcontext
    loss_scaler = None
    if args.amp:
        loss_scaler = torch.amp.GradScaler("cuda")  # planted: PT018
        if args.rank == 0:
            _logger.info("Using native Torch AMP. Training in mixed precision.")

    model = NativeDDP(model, device_ids=[args.local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss().to(args.device)

    dataset_train = create_dataset("", root=args.data_dir, split="train", is_training=True)
    loader_train = create_loader(dataset_train, input_size=(3, 224, 224), batch_size=args.batch_size,
                                 is_training=True, distributed=True, num_workers=8)

    for epoch in range(args.epochs):
        loader_train.sampler.set_epoch(epoch)
        train_one_epoch(epoch, model, loader_train, optimizer, loss_fn, args,
                        amp_autocast=amp_autocast, loss_scaler=loss_scaler)
        if args.rank == 0:
            os.makedirs(args.output, exist_ok=True)
            state = {"state_dict": model.module.state_dict(), "epoch": epoch}
            if loss_scaler is not None:
                state["amp_scaler"] = loss_scaler.state_dict()
            torch.save(state, os.path.join(args.output, "last.pth.tar"))

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
