"""Image classification training in the style of a references/classification recipe.

Planted: PT011 - export_checkpoint() ends with dist.barrier(), but it is only ever called under is_main_process()
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def is_dist_avail_and_initialized():
    return dist.is_available() and dist.is_initialized()


def get_rank():
    if not is_dist_avail_and_initialized():
        return 0
    return dist.get_rank()


def is_main_process():
    return get_rank() == 0


def export_checkpoint(model_without_ddp, optimizer, lr_scheduler, epoch, output_dir):
    checkpoint = {
        "model": model_without_ddp.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": lr_scheduler.state_dict(),
        "epoch": epoch,
    }
    torch.save(checkpoint, os.path.join(output_dir, f"model_{epoch}.pth"))
    torch.save(checkpoint, os.path.join(output_dir, "checkpoint.pth"))
    # make sure the files are on disk before anyone moves on
    dist.barrier()  # planted: PT011


def train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, print_freq):
    model.train()
    start = time.time()
    for i, (image, target) in enumerate(data_loader):
        image = image.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        output = model(image)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % print_freq == 0 and is_main_process():
            print(f"Epoch [{epoch}] [{i}/{len(data_loader)}] loss {loss.item():.4f} "
                  f"time {time.time() - start:.1f}s")


def evaluate(model, data_loader, device):
    model.eval()
    counts = torch.zeros(2, device=device)
    with torch.inference_mode():
        for image, target in data_loader:
            image = image.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            pred = model(image).argmax(dim=1)
            counts[0] += (pred == target).sum()
            counts[1] += target.numel()
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item() * 100.0


def main(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    device = torch.device("cuda", local_rank)

    dataset = torchvision.datasets.ImageFolder(os.path.join(args.data_path, "train"),
                                               transform=torchvision.transforms.ToTensor())
    dataset_test = torchvision.datasets.ImageFolder(os.path.join(args.data_path, "val"),
                                                    transform=torchvision.transforms.ToTensor())
    train_sampler = DistributedSampler(dataset)
    test_sampler = DistributedSampler(dataset_test, shuffle=False)
    data_loader = DataLoader(dataset, batch_size=args.batch_size, sampler=train_sampler,
                             num_workers=args.workers, pin_memory=True)
    data_loader_test = DataLoader(dataset_test, batch_size=args.batch_size, sampler=test_sampler,
                                  num_workers=args.workers, pin_memory=True)

    model = torchvision.models.get_model(args.model, num_classes=1000).to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    model_without_ddp = model.module

    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args.print_freq)
        lr_scheduler.step()
        acc1 = evaluate(model, data_loader_test, device)
        if is_main_process():
            print(f"Epoch {epoch}: Acc@1 {acc1:.3f}")
            export_checkpoint(model_without_ddp, optimizer, lr_scheduler, epoch, args.output_dir)

    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-path", default="/datasets01/imagenet_full_size/061417/")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--print-freq", type=int, default=10)
    parser.add_argument("--output-dir", default=".")
    main(parser.parse_args())
