"""Hand-written ZeRO stage 1: every rank owns one slice of the optimizer state."""
import math
import os

import torch
import torch.distributed as tdist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler as DS


class ShardedAdamW:
    def __init__(self, params, rank, world, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, wd=0.01):
        self.params = [p for p in params if p.requires_grad]
        self.rank, self.world = rank, world
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, wd
        numel = sum(p.numel() for p in self.params)
        self.padded = math.ceil(numel / world) * world
        self.shard = self.padded // world
        dev = self.params[0].device
        self.flat_params = torch.zeros(self.padded, device=dev)
        self._flatten_params()
        lo = rank * self.shard
        self.master = self.flat_params[lo:lo + self.shard].clone()
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.step_count = 0

    def _flatten_params(self):
        off = 0
        for p in self.params:
            n = p.numel()
            self.flat_params[off:off + n].copy_(p.detach().view(-1))
            off += n

    def _unflatten_params(self):
        off = 0
        for p in self.params:
            n = p.numel()
            p.data.copy_(self.flat_params[off:off + n].view_as(p))
            off += n

    @torch.no_grad()
    def step(self):
        flat_grads = torch.zeros(self.padded, device=self.master.device)
        off = 0
        for p in self.params:
            n = p.numel()
            if p.grad is not None:
                flat_grads[off:off + n].copy_(p.grad.view(-1))
            off += n
        grad_shard = torch.empty(self.shard, device=flat_grads.device)
        tdist.reduce_scatter_tensor(grad_shard, flat_grads, op=tdist.ReduceOp.AVG)
        self.step_count += 1
        b1, b2 = self.betas
        self.master.mul_(1 - self.lr * self.wd)
        self.exp_avg.mul_(b1).add_(grad_shard, alpha=1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(grad_shard, grad_shard, value=1 - b2)
        bc1, bc2 = 1 - b1 ** self.step_count, 1 - b2 ** self.step_count
        denom = (self.exp_avg_sq / bc2).sqrt_().add_(self.eps)
        self.master.addcdiv_(self.exp_avg, denom, value=-self.lr / bc1)
        tdist.all_gather_into_tensor(self.flat_params, self.master)
        self._unflatten_params()

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def shard_state(self):
        return {"master": self.master, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "step": self.step_count}


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    tdist.init_process_group("nccl")
    rank, world = tdist.get_rank(), tdist.get_world_size()
    device = torch.device("cuda", local_rank)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
    for p in model.parameters():
        tdist.broadcast(p.data, src=0)
    opt = ShardedAdamW(model.parameters(), rank, world, lr=3e-4)

    ds = TensorDataset(torch.randn(40_000, 256), torch.randint(0, 10, (40_000,)))
    sampler = DS(ds, num_replicas=world, rank=rank)
    loader = DataLoader(ds, batch_size=128, sampler=sampler, drop_last=True)

    os.makedirs("zero1_ckpt", exist_ok=True)
    for epoch in range(5):
        sampler.set_epoch(epoch)
        loss_sum = torch.zeros(1, device=device)
        seen = torch.zeros(1, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss_sum += loss.detach() * x.size(0)
            seen += x.size(0)
        totals = torch.cat([loss_sum, seen])
        tdist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch}: mean train loss {(totals[0] / totals[1]).item():.4f}")
            torch.save(model.state_dict(), "zero1_ckpt/model.pt")
        torch.save(opt.shard_state(), f"zero1_ckpt/optim_shard_{rank:03d}.pt")
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
