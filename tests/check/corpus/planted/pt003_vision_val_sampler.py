"""Classification training in the layout of torchvision's references/classification/train.py.

Planted: PT003 - the test sampler is built but data_loader_test is created without it.
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torchvision
from torch import nn
from torchvision.transforms import v2 as T


def init_distributed_mode(args):
    args.rank = int(os.environ["RANK"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl", init_method="env://", world_size=args.world_size, rank=args.rank)
    dist.barrier()


def load_data(traindir, valdir):
    train_tf = T.Compose([T.RandomResizedCrop(176), T.RandomHorizontalFlip(), T.ToImage(), T.ToDtype(torch.float, scale=True)])
    val_tf = T.Compose([T.Resize(232), T.CenterCrop(224), T.ToImage(), T.ToDtype(torch.float, scale=True)])
    dataset = torchvision.datasets.ImageFolder(traindir, train_tf)
    dataset_test = torchvision.datasets.ImageFolder(valdir, val_tf)
    return dataset, dataset_test


def evaluate(model, criterion, data_loader, device):
    model.eval()
    sums = torch.zeros(3, device=device, dtype=torch.float64)
    with torch.inference_mode():
        for image, target in data_loader:
            image = image.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(image)
            sums[0] += criterion(output, target) * image.shape[0]
            sums[1] += (output.argmax(1) == target).sum()
            sums[2] += image.shape[0]
    dist.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (100 * sums[1] / sums[2]).item()


def main(args):
    init_distributed_mode(args)
    device = torch.device("cuda")
    dataset, dataset_test = load_data(os.path.join(args.data_path, "train"), os.path.join(args.data_path, "val"))
    train_sampler = torch.utils.data.distributed.DistributedSampler(dataset)
    test_sampler = torch.utils.data.distributed.DistributedSampler(dataset_test, shuffle=False)  # planted: PT003
    data_loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=train_sampler, num_workers=args.workers, pin_memory=True)
    data_loader_test = torch.utils.data.DataLoader(dataset_test, batch_size=args.batch_size, num_workers=args.workers, pin_memory=True)

    model = torchvision.models.get_model(args.model, num_classes=1000).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    model_without_ddp = model.module
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=2e-5)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    scaler = torch.amp.GradScaler("cuda")

    start_time = time.time()
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for image, target in data_loader:
            image, target = image.to(device), target.to(device)
            with torch.autocast("cuda"):
                loss = criterion(model(image), target)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        lr_scheduler.step()
        val_loss, acc1 = evaluate(model, criterion, data_loader_test, device)
        if args.rank == 0:
            print(f"Epoch {epoch}: val loss {val_loss:.3f} acc@1 {acc1:.3f}")
            checkpoint = {"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                          "lr_scheduler": lr_scheduler.state_dict(), "epoch": epoch, "scaler": scaler.state_dict()}
            torch.save(checkpoint, os.path.join(args.output_dir, f"model_{epoch}.pth"))
    if args.rank == 0:
        print(f"Training time {datetime.timedelta(seconds=int(time.time() - start_time))}")
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--data-path", default="/datasets01/imagenet_full_size/061417/")
    p.add_argument("--model", default="resnet50")
    p.add_argument("-b", "--batch-size", default=32, type=int)
    p.add_argument("--epochs", default=90, type=int)
    p.add_argument("-j", "--workers", default=16, type=int)
    p.add_argument("--lr", default=0.5, type=float)
    p.add_argument("--output-dir", default=".")
    main(p.parse_args())
