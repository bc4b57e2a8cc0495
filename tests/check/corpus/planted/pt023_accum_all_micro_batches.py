"""Semantic segmentation (DeepLabV3) with gradient accumulation and no_sync to save bandwidth.

Planted: PT023 - the whole micro-step, the accumulation-closing one included, runs under model.no_sync()
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision.models.segmentation import deeplabv3_resnet50

from seg_data import CityscapesPairs

ACCUM_STEPS = 2
EPOCHS = 120


def main():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    train_ds = CityscapesPairs("/data/cityscapes", split="train")
    sampler = DistributedSampler(train_ds)
    loader = DataLoader(train_ds, batch_size=4, sampler=sampler, num_workers=8, pin_memory=True,
                        drop_last=True)

    model = deeplabv3_resnet50(num_classes=19, aux_loss=True)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)
    model = DDP(model, device_ids=[local_rank])
    criterion = nn.CrossEntropyLoss(ignore_index=255)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)
    total_updates = EPOCHS * (len(loader) // ACCUM_STEPS)
    scheduler = torch.optim.lr_scheduler.PolynomialLR(optimizer, total_iters=total_updates, power=0.9)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        stats = torch.zeros(2, device=device)
        for it, (image, target) in enumerate(loader):
            image = image.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            with model.no_sync():  # planted: PT023
                out = model(image)
                loss = criterion(out["out"], target) + 0.5 * criterion(out["aux"], target)
                (loss / ACCUM_STEPS).backward()
            stats[0] += loss.detach()
            stats[1] += 1
            if (it + 1) % ACCUM_STEPS == 0:
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

        dist.all_reduce(stats)
        if rank == 0:
            print(f"epoch {epoch}: loss {(stats[0] / stats[1]).item():.4f} "
                  f"lr {optimizer.param_groups[0]['lr']:.5f}")
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch}, "deeplab_last.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
