"""EfficientNet-B0 training on Tiny-ImageNet with DDP; a checkpoint is written at the end of every epoch.

Planted: PT010 - torch.save(...) runs on every rank with the same file name (no rank-0 guard).
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main(data="data/tiny-imagenet-200", epochs=60, batch_size=128):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    tf = torchvision.transforms.Compose([torchvision.transforms.RandomResizedCrop(64), torchvision.transforms.ToTensor()])
    train_set = torchvision.datasets.ImageFolder(os.path.join(data, "train"), tf)
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler, num_workers=6, pin_memory=True)

    model = torchvision.models.efficientnet_b0(num_classes=200).to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.RMSprop(model.parameters(), lr=0.016, alpha=0.9, eps=0.0316, weight_decay=1e-5)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        meter = torch.zeros(2, device=device)
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            meter[0] += loss.detach() * labels.size(0)
            meter[1] += labels.size(0)
        dist.all_reduce(meter)
        if rank == 0:
            print(f"epoch {epoch}: loss {(meter[0] / meter[1]).item():.4f}")
        torch.save({"epoch": epoch, "model": model.module.state_dict()}, "effnet_tinyimagenet.pth")  # planted: PT010
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
