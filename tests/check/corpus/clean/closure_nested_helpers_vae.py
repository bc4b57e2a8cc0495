"""Variational autoencoder trained through closures built by a make_trainer() factory."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class VAE(nn.Module):
    def __init__(self, d=784, z=32):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 400), nn.ReLU(), nn.Linear(400, 2 * z))
        self.dec = nn.Sequential(nn.Linear(z, 400), nn.ReLU(), nn.Linear(400, d))

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, dim=-1)
        zs = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.dec(zs), mu, logvar


def make_trainer(rank, local_rank, world_size, data, epochs=20, batch_size=128):
    device = torch.device(f"cuda:{local_rank}")
    model = DDP(VAE().to(device), device_ids=[local_rank])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler, pin_memory=True)
    log0 = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)

    def elbo(x):
        recon, mu, logvar = model(x)
        rec = F.binary_cross_entropy_with_logits(recon, x, reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return (rec + kld) / x.size(0)

    def step(x):
        loss = elbo(x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    def run_epoch(epoch):
        sampler.set_epoch(epoch)
        model.train()
        acc = torch.zeros(2, device=device)
        for (x,) in loader:
            x = x.to(device, non_blocking=True).flatten(1)
            acc += torch.stack([step(x) * x.size(0), torch.tensor(float(x.size(0)), device=device)])
        dist.all_reduce(acc)
        return (acc[0] / acc[1]).item()

    def checkpoint(path):
        def _write():
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict()}, path)

        if rank == 0:
            _write()

    def fit():
        for epoch in range(epochs):
            avg = run_epoch(epoch)
            log0(f"epoch {epoch:02d}  -ELBO per sample {avg:.2f}")
            checkpoint("vae.pt")

    return fit


def worker(gpu, ngpus_per_node, node_rank, world_size):
    global_rank = node_rank * ngpus_per_node + gpu
    torch.cuda.set_device(gpu)
    dist.init_process_group("nccl", init_method="env://", world_size=world_size, rank=global_rank)
    data = TensorDataset(torch.rand(60_000, 1, 28, 28))
    fit = make_trainer(global_rank, gpu, world_size, data)
    fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    ngpus = torch.cuda.device_count()
    nnodes = int(os.environ.get("NNODES", "1"))
    node_rank = int(os.environ.get("NODE_RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    mp.spawn(worker, nprocs=ngpus, args=(ngpus, node_rank, ngpus * nnodes))
