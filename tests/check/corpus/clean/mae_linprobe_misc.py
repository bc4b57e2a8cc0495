"""MAE linear-probe shape: util.misc helpers (is_main_process, save_model via save_on_master), frozen encoder, BN head."""
import builtins
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import models_vit


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            now = datetime.datetime.now().time()
            builtin_print(f"[{now}] ", end="")
            builtin_print(*args, **kwargs)

    builtins.print = print


def get_rank():
    if not dist.is_available() or not dist.is_initialized():
        return 0
    return dist.get_rank()


def is_main_process():
    return get_rank() == 0


def save_on_master(*args, **kwargs):
    if is_main_process():
        torch.save(*args, **kwargs)


def save_model(args, epoch, model_without_ddp, optimizer):
    to_save = {"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
               "epoch": epoch}
    save_on_master(to_save, os.path.join(args.output_dir, f"checkpoint-{epoch}.pth"))


def load_model(args, model_without_ddp, optimizer):
    if not args.resume:
        return
    checkpoint = torch.load(args.resume, map_location="cpu", weights_only=True)
    model_without_ddp.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    args.start_epoch = checkpoint["epoch"] + 1
    print(f"Resume checkpoint {args.resume}")


@torch.no_grad()
def evaluate(loader, model, device):
    model.eval()
    correct = torch.zeros(1, device=device)
    count = torch.zeros(1, device=device)
    for images, target in loader:
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            output = model(images)
        correct += (output.argmax(1) == target).sum()
        count += target.numel()
    dist.all_reduce(correct)
    dist.all_reduce(count)
    acc = (correct / count).item() * 100
    print(f"* Acc@1 {acc:.3f}")
    return acc


def main(args, dataset_train, dataset_val):
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl")
    setup_for_distributed(dist.get_rank() == 0)
    device = torch.device("cuda", args.gpu)
    sampler_train = torch.utils.data.DistributedSampler(dataset_train)
    sampler_val = torch.utils.data.DistributedSampler(dataset_val, shuffle=False)
    data_loader_train = torch.utils.data.DataLoader(dataset_train, sampler=sampler_train,
                                                    batch_size=args.batch_size, drop_last=True)
    data_loader_val = torch.utils.data.DataLoader(dataset_val, sampler=sampler_val,
                                                  batch_size=args.batch_size)
    model = models_vit.__dict__[args.model](num_classes=args.nb_classes, global_pool=False)
    model.head = nn.Sequential(nn.BatchNorm1d(model.head.in_features, affine=False, eps=1e-6), model.head)
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith("head")
    model.to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    model_without_ddp = model.module
    optimizer = torch.optim.SGD(model_without_ddp.head.parameters(), lr=args.lr, momentum=0.9)
    load_model(args, model_without_ddp, optimizer)
    criterion = nn.CrossEntropyLoss()
    start_time = time.time()
    max_accuracy = 0.0
    for epoch in range(args.start_epoch, args.epochs):
        sampler_train.set_epoch(epoch)
        model.train()
        for samples, targets in data_loader_train:
            samples = samples.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = criterion(model(samples), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if args.output_dir:
            save_model(args, epoch, model_without_ddp, optimizer)
        acc = evaluate(data_loader_val, model, device)
        max_accuracy = max(max_accuracy, acc)
        print(f"Max accuracy: {max_accuracy:.2f}%")
    print(f"Training time {datetime.timedelta(seconds=int(time.time() - start_time))}")
