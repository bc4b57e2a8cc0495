"""Image classification training loop in the shape of timm's train.py (torchrun launch).

Planted: PT001 - the model is moved with .cuda(rank) where rank came from tdist.get_rank() (global).
"""
import argparse
import logging
import os
import time

import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as NativeDDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler as DistSampler
from torchvision import datasets, transforms
from torchvision.models import resnet50

_logger = logging.getLogger("train")

parser = argparse.ArgumentParser()
parser.add_argument("--data-dir", default="/data/imagenet")
parser.add_argument("--opt", default="sgd")
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument("-b", "--batch-size", type=int, default=128)
parser.add_argument("--output", default="./output")


def create_optimizer(args, model):
    match args.opt:
        case "sgd":
            return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
        case "adamw":
            return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
        case other:
            raise ValueError(f"unknown optimizer {other}")


def main():
    logging.basicConfig(level=logging.INFO)
    args = parser.parse_args()
    tdist.init_process_group(backend="nccl", init_method="env://")
    rank = tdist.get_rank()
    world_size = tdist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    _logger.info("process %d of %d, local device %d", rank, world_size, local_rank)

    model = resnet50(num_classes=1000)
    model = model.cuda(rank)  # planted: PT001
    model = NativeDDP(model, device_ids=[local_rank])
    optimizer = create_optimizer(args, model)
    loss_fn = nn.CrossEntropyLoss().cuda()
    scaler = torch.amp.GradScaler("cuda")

    tfm = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])
    dataset_train = datasets.ImageFolder(os.path.join(args.data_dir, "train"), transform=tfm)
    sampler = DistSampler(dataset_train)
    loader_train = DataLoader(dataset_train, batch_size=args.batch_size, sampler=sampler, num_workers=8, pin_memory=True, drop_last=True)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        start = time.time()
        loss_sum = torch.zeros(2, device="cuda")
        for batch_idx, (inputs, targets) in enumerate(loader_train):
            inputs = inputs.cuda(non_blocking=True)
            targets = targets.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(model(inputs), targets)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            loss_sum[0] += loss.detach() * inputs.size(0)
            loss_sum[1] += inputs.size(0)
            if (n := batch_idx + 1) % 200 == 0:
                _logger.info("rank %d step %d", rank, n)
        tdist.all_reduce(loss_sum)
        if rank == 0:
            _logger.info("epoch %d loss %.4f (%.1fs)", epoch, (loss_sum[0] / loss_sum[1]).item(), time.time() - start)
            os.makedirs(args.output, exist_ok=True)
            torch.save({"epoch": epoch, "state_dict": model.module.state_dict()}, os.path.join(args.output, "last.pth.tar"))
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
