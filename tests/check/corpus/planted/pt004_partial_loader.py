"""Object-detection fine-tuning (Faster R-CNN) with DDP; loaders come from a functools.partial factory.

Planted: PT004 - make_loader = partial(DataLoader, shuffle=True, ...) is then called with sampler=train_sampler.
"""
import argparse
import functools
import os

import torch
import torch.distributed as dist
import torchvision
from torch.utils.data import DataLoader, DistributedSampler
from torchvision.models.detection import fasterrcnn_resnet50_fpn

from coco_utils import get_coco


def collate_fn(batch):
    return tuple(zip(*batch))


def train_one_epoch(model, optimizer, data_loader, device, epoch, rank):
    model.train()
    data_loader.sampler.set_epoch(epoch)
    for images, targets in data_loader:
        images = [img.to(device) for img in images]
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        loss_dict = model(images, targets)
        losses = sum(loss for loss in loss_dict.values())
        optimizer.zero_grad()
        losses.backward()
        optimizer.step()
    reduced = torch.stack([v.detach() for v in loss_dict.values()])
    dist.all_reduce(reduced, op=dist.ReduceOp.AVG)
    if rank == 0:
        print(f"epoch {epoch}: last-step losses {reduced.tolist()}")


def main(args):
    dist.init_process_group(backend="nccl")
    gpu = int(os.environ["LOCAL_RANK"])
    rank = dist.get_rank()
    torch.cuda.set_device(gpu)
    device = torch.device("cuda")

    dataset = get_coco(args.data_path, image_set="train", transforms=torchvision.transforms.ToTensor())
    train_sampler = DistributedSampler(dataset)
    make_loader = functools.partial(DataLoader, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, collate_fn=collate_fn)
    data_loader = make_loader(dataset, sampler=train_sampler)  # planted: PT004

    model = fasterrcnn_resnet50_fpn(weights=None, num_classes=91).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[16, 22], gamma=0.1)

    for epoch in range(args.epochs):
        train_one_epoch(model, optimizer, data_loader, device, epoch, rank)
        lr_scheduler.step()
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                       os.path.join(args.output_dir, f"model_{epoch}.pth"))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-path", default="/datasets01/COCO/022719/")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--epochs", type=int, default=26)
    parser.add_argument("--output-dir", default=".")
    main(parser.parse_args())
