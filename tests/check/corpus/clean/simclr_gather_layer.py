"""SimCLR shape: NT-Xent over features gathered from all ranks with a differentiable all_gather, LARS-free SGD, rank-0 logging."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


class GatherLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x)
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        all_grads = torch.stack(grads)
        dist.all_reduce(all_grads)
        return all_grads[dist.get_rank()]


def nt_xent(z1, z2, temperature=0.2):
    z = torch.cat([torch.cat(GatherLayer.apply(z1)), torch.cat(GatherLayer.apply(z2))])
    z = F.normalize(z, dim=1)
    n = z.shape[0] // 2
    sim = z @ z.t() / temperature
    sim.fill_diagonal_(float("-inf"))
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(sim, targets)


def main(encoder, dataset, epochs=100):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank)
    sampler = DistributedSampler(dataset, drop_last=True)
    loader = DataLoader(dataset, batch_size=256, sampler=sampler, num_workers=10, drop_last=True)
    model = nn.Sequential(encoder, nn.Linear(2048, 512), nn.ReLU(), nn.Linear(512, 128))
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3 * world, momentum=0.9, weight_decay=1e-6)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(1, device=device)
        for (x1, x2), _ in loader:
            x1 = x1.to(device, non_blocking=True)
            x2 = x2.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                z1, z2 = model(torch.cat([x1, x2])).float().chunk(2)
                loss = nt_xent(z1, z2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.detach()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"epoch {epoch}: contrastive loss {(total / len(loader)).item():.4f}")
            torch.save({"encoder": model.module[0].state_dict(), "epoch": epoch}, "simclr_encoder.pt")
    dist.destroy_process_group()
