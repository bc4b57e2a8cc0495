"""timm-flavoured image classification training with a validate() helper run by every rank.

Planted: PT016 - validate() prints the reduced top-1 accuracy itself, on every rank
"""
import argparse
import logging
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as NativeDDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, models, transforms

_logger = logging.getLogger("train")


def is_primary(args):
    return args.rank == 0


def reduce_sum(value, device):
    t = torch.tensor(value, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.item()


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args):
    model.train()
    end = time.time()
    for batch_idx, (input, target) in enumerate(loader):
        input, target = input.to(args.device), target.to(args.device)
        loss = loss_fn(model(input), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0 and is_primary(args):
            _logger.info("Train: %d [%d/%d] Loss: %.4f (%.3fs/it)", epoch, batch_idx, len(loader),
                         loss.item(), (time.time() - end) / (batch_idx + 1))


def validate(model, loader, args):
    model.eval()
    correct, seen = 0, 0
    with torch.no_grad():
        for input, target in loader:
            input, target = input.to(args.device), target.to(args.device)
            correct += (model(input).argmax(1) == target).sum().item()
            seen += target.size(0)
    top1 = 100.0 * reduce_sum(correct, args.device) / reduce_sum(seen, args.device)
    print(f"Test: Acc@1 {top1:.3f}")  # planted: PT016
    return top1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("-b", "--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log-interval", type=int, default=50)
    parser.add_argument("--output", default="./output/train")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    args.local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    args.rank = dist.get_rank()
    args.device = torch.device("cuda", args.local_rank)

    tfm = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])
    eval_tfm = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()])
    dataset_train = datasets.ImageFolder(os.path.join(args.data_dir, "train"), tfm)
    dataset_eval = datasets.ImageFolder(os.path.join(args.data_dir, "val"), eval_tfm)
    train_sampler = DistributedSampler(dataset_train)
    loader_train = DataLoader(dataset_train, batch_size=args.batch_size, sampler=train_sampler,
                              num_workers=8, pin_memory=True, drop_last=True)
    loader_eval = DataLoader(dataset_eval, batch_size=args.batch_size,
                             sampler=DistributedSampler(dataset_eval, shuffle=False), num_workers=8)

    model = models.__dict__[args.model]().to(args.device)
    model = NativeDDP(model, device_ids=[args.local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=2e-5)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)

    best_metric = None
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        train_one_epoch(epoch, model, loader_train, optimizer, loss_fn, args)
        top1 = validate(model, loader_eval, args)
        if is_primary(args) and (best_metric is None or top1 > best_metric):
            best_metric = top1
            os.makedirs(args.output, exist_ok=True)
            torch.save({"state_dict": model.module.state_dict(), "epoch": epoch, "top1": top1},
                       os.path.join(args.output, "model_best.pth.tar"))

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
