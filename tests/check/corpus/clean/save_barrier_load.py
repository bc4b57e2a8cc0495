"""DDP-tutorial checkpoint shape: rank 0 saves initial weights, barrier, every rank loads them with a cuda:0 -> local map_location."""
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


def demo_checkpoint(local_rank):
    rank = dist.get_rank()
    model = ToyModel().to(local_rank)
    ddp_model = DDP(model, device_ids=[local_rank])
    checkpoint_path = os.path.join(tempfile.gettempdir(), "model.checkpoint")
    if rank == 0:
        torch.save(ddp_model.module.state_dict(), checkpoint_path)
    dist.barrier()
    map_location = {"cuda:0": f"cuda:{local_rank}"}
    ddp_model.module.load_state_dict(torch.load(checkpoint_path, map_location=map_location, weights_only=True))

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    for _ in range(10):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10, device=local_rank))
        labels = torch.randn(20, 5, device=local_rank)
        loss_fn(outputs, labels).backward()
        optimizer.step()

    dist.barrier()
    if rank == 0:
        os.remove(checkpoint_path)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    print(f"[rank {dist.get_rank()}] running checkpoint demo on cuda:{local_rank}")
    demo_checkpoint(local_rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
