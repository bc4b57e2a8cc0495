"""Classification reference-style training; evaluate() is a helper and the main loop logs its result.

Planted: PT020 - evaluate() returns correct/total of this rank's shard only, and rank 0 logs it as the accuracy
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("classification")


def is_main_process():
    return dist.get_rank() == 0


def train_one_epoch(model, criterion, optimizer, loader, device, epoch):
    model.train()
    for i, (image, target) in enumerate(loader):
        image = image.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        loss = criterion(model(image), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % 100 == 0 and is_main_process():
            logger.info("Epoch [%d] [%d/%d] loss %.4f", epoch, i, len(loader), loss.item())


def evaluate(model, loader, device):
    model.eval()
    num_correct = 0
    num_seen = 0
    with torch.inference_mode():
        for image, target in loader:
            image = image.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            num_correct += (model(image).argmax(1) == target).sum().item()
            num_seen += image.shape[0]
    return num_correct / num_seen


def main(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    device = torch.device("cuda", local_rank)

    tfm = torchvision.transforms.Compose([torchvision.transforms.RandomResizedCrop(176),
                                          torchvision.transforms.ToTensor()])
    val_tfm = torchvision.transforms.Compose([torchvision.transforms.Resize(232),
                                              torchvision.transforms.CenterCrop(224),
                                              torchvision.transforms.ToTensor()])
    dataset = torchvision.datasets.ImageFolder(os.path.join(args.data_path, "train"), tfm)
    dataset_test = torchvision.datasets.ImageFolder(os.path.join(args.data_path, "val"), val_tfm)
    train_sampler = DistributedSampler(dataset)
    test_sampler = DistributedSampler(dataset_test, shuffle=False)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=train_sampler, num_workers=16, pin_memory=True)
    loader_test = DataLoader(dataset_test, batch_size=args.batch_size, sampler=test_sampler, num_workers=16)

    model = torchvision.models.resnet50().to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    model_without_ddp = model.module
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=2e-5)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu", weights_only=True)
        model_without_ddp.load_state_dict(checkpoint["model"])
        args.start_epoch = checkpoint["epoch"] + 1

    for epoch in range(args.start_epoch, args.epochs):
        train_sampler.set_epoch(epoch)
        train_one_epoch(model, criterion, optimizer, loader, device, epoch)
        lr_scheduler.step()
        acc1 = evaluate(model, loader_test, device)
        if is_main_process():
            logger.info("Epoch %d Acc@1 %.3f", epoch, 100.0 * acc1)  # planted: PT020
            torch.save({"model": model_without_ddp.state_dict(), "epoch": epoch},
                       os.path.join(args.output_dir, "checkpoint.pth"))

    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-path", default="/datasets01/imagenet_full_size/061417/")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=600)
    parser.add_argument("--start-epoch", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--resume", default="")
    parser.add_argument("--output-dir", default=".")
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())
