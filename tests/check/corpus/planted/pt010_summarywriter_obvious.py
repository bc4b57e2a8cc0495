"""PPO-free supervised pretraining of a policy network on recorded trajectories, DDP + TensorBoard.

Planted: PT010 - SummaryWriter(log_dir) is created on every rank (one event file per process in the same directory).
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter

from rl_data import TrajectoryDataset


class Policy(nn.Module):
    def __init__(self, obs_dim, act_dim, hidden=256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, act_dim))

    def forward(self, obs):
        return self.net(obs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data/halfcheetah_expert.npz")
    parser.add_argument("--log-dir", default="runs/bc")
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()
    writer = SummaryWriter(log_dir=args.log_dir)  # planted: PT010

    dataset = TrajectoryDataset(args.data)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=512, sampler=sampler)
    model = DDP(Policy(dataset.obs_dim, dataset.act_dim).to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)

    global_step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        sums = torch.zeros(2, device=device)
        for obs, act in loader:
            obs, act = obs.to(device), act.to(device)
            loss = nn.functional.mse_loss(model(obs), act)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            sums[0] += loss.detach()
            sums[1] += 1
            global_step += 1
        dist.all_reduce(sums)
        if rank == 0:
            writer.add_scalar("train/bc_loss", (sums[0] / sums[1]).item(), global_step)
            torch.save(model.module.state_dict(), os.path.join(args.log_dir, "policy.pt"))
    if rank == 0:
        writer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
