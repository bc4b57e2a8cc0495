"""torchvision detection-reference shape: list-of-dict targets, reduce_dict averaging losses, GroupedBatchSampler-free loader."""
import math
import os
import sys

import torch
import torch.distributed as dist
import torchvision
from torchvision.models.detection import fasterrcnn_resnet50_fpn


def get_world_size():
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size()


def is_main_process():
    return not dist.is_initialized() or dist.get_rank() == 0


def reduce_dict(input_dict, average=True):
    world_size = get_world_size()
    if world_size < 2:
        return input_dict
    with torch.inference_mode():
        names = sorted(input_dict.keys())
        values = torch.stack([input_dict[k] for k in names], dim=0)
        dist.all_reduce(values)
        if average:
            values /= world_size
        return {k: v for k, v in zip(names, values)}


def collate_fn(batch):
    return tuple(zip(*batch))


def train_one_epoch(model, optimizer, data_loader, device, epoch, scaler=None, print_freq=20):
    model.train()
    for it, (images, targets) in enumerate(data_loader):
        images = [img.to(device) for img in images]
        targets = [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in t.items()}
                   for t in targets]
        with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=scaler is not None):
            loss_dict = model(images, targets)
            losses = sum(loss for loss in loss_dict.values())
        loss_dict_reduced = reduce_dict(loss_dict)
        loss_value = sum(loss_dict_reduced.values()).item()
        if not math.isfinite(loss_value):
            if is_main_process():
                print(f"Loss is {loss_value}, stopping training")
                print(loss_dict_reduced)
            sys.exit(1)
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(losses).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            losses.backward()
            optimizer.step()
        if it % print_freq == 0 and is_main_process():
            parts = ", ".join(f"{k}: {v.item():.4f}" for k, v in loss_dict_reduced.items())
            print(f"Epoch [{epoch}] [{it}/{len(data_loader)}] loss {loss_value:.4f} ({parts})")


def main(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)

    dataset = torchvision.datasets.CocoDetection(args.images, args.annotations)
    train_sampler = torch.utils.data.distributed.DistributedSampler(dataset)
    batch_sampler = torch.utils.data.BatchSampler(train_sampler, args.batch_size, drop_last=True)
    data_loader = torch.utils.data.DataLoader(dataset, batch_sampler=batch_sampler,
                                              num_workers=args.workers, collate_fn=collate_fn)

    model = fasterrcnn_resnet50_fpn(num_classes=91)
    model.to(device)
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    model_without_ddp = model.module
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[16, 22], gamma=0.1)
    scaler = torch.amp.GradScaler("cuda") if args.amp else None

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        train_one_epoch(model, optimizer, data_loader, device, epoch, scaler)
        lr_scheduler.step()
        if is_main_process():
            torch.save({"model": model_without_ddp.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "lr_scheduler": lr_scheduler.state_dict(),
                        "epoch": epoch},
                       os.path.join(args.output_dir, f"model_{epoch}.pth"))
    dist.destroy_process_group()
