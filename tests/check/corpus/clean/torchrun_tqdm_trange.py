"""Script-style torchrun shape: `for epoch in trange(...)` with progress bars disabled off rank 0 and a module-level is_main flag."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm, trange

from model import UNet
from data import SegmentationDataset

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group(backend="nccl")
is_main = dist.get_rank() == 0
device = torch.device("cuda", local_rank)

train_ds = SegmentationDataset("train")
sampler = DistributedSampler(train_ds, shuffle=True, seed=0)
train_dl = DataLoader(train_ds, batch_size=8, sampler=sampler, num_workers=4, pin_memory=True)

net = UNet(in_channels=3, num_classes=4).to(device)
net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)
net = DDP(net, device_ids=[local_rank])
optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cuda")
criterion = torch.nn.CrossEntropyLoss()

for epoch in trange(100, desc="epochs", disable=not is_main):
    sampler.set_epoch(epoch)
    net.train()
    loss_meter = torch.zeros(2, device=device)
    for images, masks in tqdm(train_dl, leave=False, disable=not is_main):
        images = images.to(device, non_blocking=True)
        masks = masks.to(device, non_blocking=True)
        with torch.autocast("cuda"):
            loss = criterion(net(images), masks)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        loss_meter[0] += loss.detach() * images.size(0)
        loss_meter[1] += images.size(0)
    dist.all_reduce(loss_meter)
    if is_main:
        tqdm.write(f"epoch {epoch}: loss {(loss_meter[0] / loss_meter[1]).item():.4f}")
        if (epoch + 1) % 10 == 0:
            torch.save(net.module.state_dict(), f"unet_epoch{epoch + 1}.pt")

dist.destroy_process_group()
