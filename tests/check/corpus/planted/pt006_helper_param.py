"""Point-cloud classification (PointNet) with DDP; checkpoints go through a save_checkpoint() helper.

Planted: PT006 - save_checkpoint() saves model.state_dict() of the DDP model its caller passes in.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.nn.parallel as par
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from pointnet.dataset import ModelNet40
from pointnet.model import PointNetCls


def save_checkpoint(model, optimizer, epoch, path):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)  # planted: PT006


def reduce_mean(value, device):
    t = torch.tensor([value], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    return t.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-points", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--outf", default="cls")
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    dataset = ModelNet40("data/modelnet40", split="train", npoints=args.num_points)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=4, drop_last=True)

    model = par.DistributedDataParallel(PointNetCls(k=40).to(device), device_ids=[local_rank])
    match args.optimizer:
        case "adam":
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
        case _:
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        running, steps = 0.0, 0
        for points, target in loader:
            points = points.transpose(2, 1).to(device, non_blocking=True)
            target = target.squeeze(-1).to(device, non_blocking=True)
            optimizer.zero_grad()
            pred, trans_feat = model(points)
            loss = F.nll_loss(pred, target)
            loss.backward()
            optimizer.step()
            running += loss.item()
            steps += 1
        scheduler.step()
        epoch_loss = reduce_mean(running / max(steps, 1), device)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {epoch_loss:.4f}")
            save_checkpoint(model, optimizer, epoch, os.path.join(args.outf, f"cls_model_{epoch}.pth"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
