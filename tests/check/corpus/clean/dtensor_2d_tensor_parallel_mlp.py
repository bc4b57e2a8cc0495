"""2-D parallel training (data x tensor) with DTensor: parallelize_module on the tp axis, FSDP2 on dp."""
import logging
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("tp")


class FeedForwardStack(nn.Module):
    def __init__(self, dim=1024, hidden=4096, depth=6, n_out=100):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"norm": nn.LayerNorm(dim), "up": nn.Linear(dim, hidden), "down": nn.Linear(hidden, dim)})
            for _ in range(depth))
        self.head = nn.Linear(dim, n_out)

    def forward(self, x):
        for b in self.blocks:
            x = x + b["down"](F.gelu(b["up"](b["norm"](x))))
        return self.head(x)


def main():
    tp_size = int(os.environ.get("TP_SIZE", "2"))
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local_rank)
    mesh = init_device_mesh("cuda", (world // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
    dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]
    dp_rank, dp_size = dp_mesh.get_local_rank(), dp_mesh.size()
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO if dist.get_rank() == 0 else logging.ERROR)

    torch.manual_seed(0)
    model = FeedForwardStack().to(device)
    for block in model.blocks:
        parallelize_module(block, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)

    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(32_768, 1024, generator=g), torch.randint(0, 100, (32_768,), generator=g))
    sampler = DistributedSampler(ds, num_replicas=dp_size, rank=dp_rank, shuffle=True)
    loader = DataLoader(ds, batch_size=64, sampler=sampler, drop_last=True)

    class_weights = distribute_tensor(torch.ones(100, device=device), tp_mesh, [Replicate()])
    for epoch in range(8):
        sampler.set_epoch(epoch)
        epoch_loss = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            loss = F.cross_entropy(out.float(), y, weight=class_weights.full_tensor())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            epoch_loss += torch.stack([loss.detach(), torch.ones((), device=device)])
        dist.all_reduce(epoch_loss, group=dp_mesh.get_group())
        mean = (epoch_loss[0] / epoch_loss[1]).item()
        logger.info("epoch %d dp=%d tp=%d mean loss %.4f", epoch, dp_size, tp_size, mean)
        dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=f"ckpt_2d/epoch{epoch}")

    probe = distribute_tensor(torch.randn(8, 1024, device=device), tp_mesh, [Shard(0)])
    logger.info("probe placements %s", probe.placements)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
