"""while-loop epoch shape: helpers that bail out with `if rank != 0: return` before writing TensorBoard scalars or checkpoints."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter


def make_writer(rank, logdir):
    if rank != 0:
        return None
    return SummaryWriter(logdir)


def report(rank, writer, epoch, metrics):
    if rank != 0:
        return
    for key, value in metrics.items():
        writer.add_scalar(key, value, epoch)
    print(f"epoch {epoch}: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))


def checkpoint(rank, model, optimizer, epoch, path):
    if rank != 0:
        return
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)


def main(model, dataset, max_epochs=40, logdir="runs/while"):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    device = torch.device("cuda", local_rank)
    writer = make_writer(rank, logdir)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)
    model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-4)
    loss_fn = nn.SmoothL1Loss()
    epoch = 0
    while epoch < max_epochs:
        sampler.set_epoch(epoch)
        running = torch.zeros((), device=device)
        for x, y in loader:
            x = x.to(device)
            y = y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            running += loss.detach()
        mean_loss = running / len(loader)
        dist.all_reduce(mean_loss)
        mean_loss /= world_size
        report(rank, writer, epoch, {"train/loss": mean_loss.item(), "lr": optimizer.param_groups[0]["lr"]})
        checkpoint(rank, model, optimizer, epoch, "while_ckpt.pt")
        epoch += 1
    dist.destroy_process_group()
