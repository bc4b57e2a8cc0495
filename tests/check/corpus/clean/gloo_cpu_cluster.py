"""CPU-cluster shape: SLURM-launched DDP over gloo with no GPUs, sums reduced then divided, rank-0 writer."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter


def init_from_slurm():
    rank = int(os.environ.get("SLURM_PROCID", 0))
    world_size = int(os.environ.get("SLURM_NTASKS", 1))
    os.environ.setdefault("MASTER_ADDR", os.environ.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"))
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", 4)))
    return rank, world_size


def main(epochs=20):
    rank, world_size = init_from_slurm()
    torch.manual_seed(42)
    features = torch.randn(20000, 32)
    targets = features @ torch.randn(32, 1) + 0.1 * torch.randn(20000, 1)
    dataset = TensorDataset(features, targets)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    loader = DataLoader(dataset, batch_size=256, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    writer = None
    if rank == 0:
        writer = SummaryWriter("runs/cpu_cluster")
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        sse = torch.zeros(2)
        for x, y in loader:
            optimizer.zero_grad()
            pred = model(x)
            loss = nn.functional.mse_loss(pred, y)
            loss.backward()
            optimizer.step()
            sse[0] += loss.item() * x.size(0)
            sse[1] += x.size(0)
        dist.all_reduce(sse, op=dist.ReduceOp.SUM)
        mse = (sse[0] / sse[1]).item()
        if rank == 0:
            writer.add_scalar("train/mse", mse, epoch)
            print(f"epoch {epoch} mse {mse:.5f}")
    if rank == 0:
        torch.save(model.module.state_dict(), "regressor.pt")
        writer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
