"""Checkpoint-sync demo: rank 0 writes the initial weights and every rank loads them, so all start equal.

Planted: PT026 - every rank torch.load()s the file rank 0 has just saved, with no dist.barrier() in between
"""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_checkpoint(local_rank, device):
    rank = dist.get_rank()
    model = ToyModel().to(device)
    ddp_model = DDP(model, device_ids=[local_rank])

    checkpoint_path = os.path.join(tempfile.gettempdir(), "model.checkpoint")
    if rank == 0:
        torch.save(ddp_model.module.state_dict(), checkpoint_path)

    map_location = {"cuda:0": f"cuda:{local_rank}"}
    state = torch.load(checkpoint_path, map_location=map_location, weights_only=True)  # planted: PT026
    ddp_model.module.load_state_dict(state)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    for step in range(20):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10, device=device))
        labels = torch.randn(20, 5, device=device)
        loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()

    loss_avg = loss.detach().clone()
    dist.all_reduce(loss_avg, op=dist.ReduceOp.AVG)
    if rank == 0:
        print(f"final loss (mean over ranks) {loss_avg.item():.4f}")

    dist.barrier()
    if rank == 0:
        os.remove(checkpoint_path)


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    demo_checkpoint(local_rank, device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
