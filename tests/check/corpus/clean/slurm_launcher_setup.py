"""SLURM srun shape: global rank from SLURM_PROCID, GPU index as rank % device_count, helper-based rank-0 checks."""
import os
import subprocess

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def setup_slurm(port=29512):
    rank = int(os.environ["SLURM_PROCID"])
    world_size = int(os.environ["SLURM_NTASKS"])
    node_list = os.environ["SLURM_NODELIST"]
    addr = subprocess.getoutput(f"scontrol show hostname {node_list} | head -n1")
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    gpu = rank % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    dist.init_process_group(backend="nccl", world_size=world_size, rank=rank)
    return rank, world_size, gpu


def get_rank():
    return dist.get_rank() if dist.is_initialized() else 0


def is_master():
    return get_rank() == 0


def train(model, dataset, epochs, rank, gpu):
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=6, pin_memory=True)
    model = DDP(model.cuda(gpu), device_ids=[gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss().cuda(gpu)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        stats = torch.zeros(3, device=torch.device("cuda", gpu))
        for images, target in loader:
            images = images.cuda(gpu, non_blocking=True)
            target = target.cuda(gpu, non_blocking=True)
            output = model(images)
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            stats += torch.stack([loss.detach() * target.size(0),
                                  (output.argmax(1) == target).sum().float(),
                                  torch.tensor(float(target.size(0)), device=stats.device)])
        dist.all_reduce(stats)
        if is_master():
            print(f"epoch {epoch}: loss {stats[0] / stats[2]:.4f} acc {stats[1] / stats[2]:.4f}")
            torch.save({"epoch": epoch, "state_dict": model.module.state_dict()}, "slurm_ckpt.pth")
    return model


if __name__ == "__main__":
    import torchvision
    rank, world_size, gpu = setup_slurm()
    ds = torchvision.datasets.FakeData(size=50000, transform=torchvision.transforms.ToTensor())
    train(torchvision.models.resnet50(), ds, epochs=5, rank=rank, gpu=gpu)
    dist.destroy_process_group()
