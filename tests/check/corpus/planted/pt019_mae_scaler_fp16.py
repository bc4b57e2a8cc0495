"""MAE-style pre-training loop: fp16 autocast, GradScaler, accum_iter passed into train_one_epoch.

Planted: PT019 - train_one_epoch scales and backpropagates the undivided loss each iteration but steps every accum_iter
"""
import argparse
import builtins
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms

import models_mae


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        if is_master or kwargs.pop("force", False):
            builtin_print(*args, **kwargs)

    builtins.print = print


def train_one_epoch(model, data_loader, optimizer, scaler, device, epoch, args):
    model.train(True)
    accum_iter = args.accum_iter
    optimizer.zero_grad()
    for data_iter_step, (samples, _) in enumerate(data_loader):
        samples = samples.to(device, non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            loss, _, _ = model(samples, mask_ratio=args.mask_ratio)
        scaler.scale(loss).backward()  # planted: PT019
        if (data_iter_step + 1) % accum_iter == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        if data_iter_step % 20 == 0:
            print(f"Epoch: [{epoch}] [{data_iter_step}/{len(data_loader)}] loss {loss.item():.4f}")


def main(args):
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl", init_method="env://")
    global_rank = dist.get_rank()
    setup_for_distributed(global_rank == 0)
    device = torch.device("cuda", args.gpu)

    transform_train = transforms.Compose([
        transforms.RandomResizedCrop(args.input_size, scale=(0.2, 1.0), interpolation=3),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    dataset_train = datasets.ImageFolder(os.path.join(args.data_path, "train"), transform=transform_train)
    sampler_train = DistributedSampler(dataset_train, shuffle=True)
    data_loader_train = DataLoader(dataset_train, sampler=sampler_train, batch_size=args.batch_size,
                                   num_workers=10, pin_memory=True, drop_last=True)

    model = models_mae.__dict__[args.model](norm_pix_loss=True)
    model.to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu], find_unused_parameters=True)
    model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=args.lr, betas=(0.9, 0.95))
    scaler = torch.amp.GradScaler("cuda")

    print(f"accumulate grad iterations: {args.accum_iter}")
    for epoch in range(args.epochs):
        data_loader_train.sampler.set_epoch(epoch)
        train_one_epoch(model, data_loader_train, optimizer, scaler, device, epoch, args)
        if global_rank == 0 and (epoch % 20 == 0 or epoch + 1 == args.epochs):
            torch.save({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict(), "epoch": epoch},
                       os.path.join(args.output_dir, f"checkpoint-{epoch}.pth"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser("MAE pre-training")
    parser.add_argument("--batch_size", default=64, type=int)
    parser.add_argument("--epochs", default=400, type=int)
    parser.add_argument("--accum_iter", default=4, type=int)
    parser.add_argument("--model", default="mae_vit_large_patch16")
    parser.add_argument("--input_size", default=224, type=int)
    parser.add_argument("--mask_ratio", default=0.75, type=float)
    parser.add_argument("--lr", type=float, default=1.5e-4)
    parser.add_argument("--data_path", default="/datasets01/imagenet_full_size/061417/")
    parser.add_argument("--output_dir", default="./output_dir")
    main(parser.parse_args())
