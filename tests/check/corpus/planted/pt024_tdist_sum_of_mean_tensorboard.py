"""Vision-transformer fine-tuning with TensorBoard logging; torch.distributed imported as tdist.

Planted: PT024 - tdist.all_reduce(t, op=tdist.ReduceOp.SUM) of losses.mean(), written to TensorBoard as the mean loss
"""
import os

import timm
import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter
from torchvision import datasets, transforms

LOG_INTERVAL = 50


def make_loader(root, train, batch_size):
    tf = transforms.Compose([
        transforms.RandomResizedCrop(224) if train else transforms.Resize(256),
        transforms.RandomHorizontalFlip() if train else transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])
    ds = datasets.ImageFolder(os.path.join(root, "train" if train else "val"), transform=tf)
    sampler = DistributedSampler(ds, shuffle=train)
    return DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=8, pin_memory=True,
                      drop_last=train)


def main():
    tdist.init_process_group("nccl")
    rank = tdist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_loader = make_loader("/data/food101", True, 64)
    model = timm.create_model("vit_base_patch16_224", pretrained=True, num_classes=101).to(device)
    model = DDP(model, device_ids=[local_rank])
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.05)

    writer = None
    if rank == 0:
        writer = SummaryWriter(log_dir="runs/vit_food101")

    global_step = 0
    for epoch in range(10):
        train_loader.sampler.set_epoch(epoch)
        model.train()
        window = []
        for images, labels in train_loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            window.append(loss.detach().float())
            global_step += 1

            if global_step % LOG_INTERVAL == 0:
                losses = torch.stack(window)
                t = losses.mean()
                tdist.all_reduce(t, op=tdist.ReduceOp.SUM)  # planted: PT024
                if rank == 0:
                    writer.add_scalar("train/loss", t.item(), global_step)
                    writer.add_scalar("train/lr", optimizer.param_groups[0]["lr"], global_step)
                window = []

        if rank == 0:
            torch.save(model.module.state_dict(), f"vit_food101_e{epoch}.pth")
    if rank == 0:
        writer.close()
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
