import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

N_USERS, N_ITEMS, DIM = 100_000, 50_000, 64


def info(*parts, sep=" ", **kw):
    if dist.get_rank() == 0:
        print(*parts, sep=sep, **kw)


def move(device, *tensors, non_blocking=True):
    return tuple(t.to(device, non_blocking=non_blocking) for t in tensors)


def global_mean(device, *values):
    buf = torch.tensor(values, device=device, dtype=torch.float32)
    dist.all_reduce(buf, op=dist.ReduceOp.AVG)
    return buf.tolist()


class Tower(nn.Module):
    def __init__(self, n_ids, n_feats, dims=(256, 128)):
        super().__init__()
        self.ids = nn.Embedding(n_ids, DIM)
        layers, d = [], DIM + n_feats
        for h in dims:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, DIM))
        self.mlp = nn.Sequential(*layers)

    def forward(self, ids, feats):
        return F.normalize(self.mlp(torch.cat([self.ids(ids), feats], -1)), dim=-1)


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.user = Tower(N_USERS, 16)
        self.item = Tower(N_ITEMS, 24)
        self.log_temp = nn.Parameter(torch.tensor(2.3))

    def forward(self, *batch):
        uid, ufeat, iid, ifeat = batch
        u, v = self.user(uid, ufeat), self.item(iid, ifeat)
        return u @ v.t() * self.log_temp.exp()


def interactions(n=2_000_000):
    return TensorDataset(torch.randint(0, N_USERS, (n,)), torch.randn(n, 16),
                         torch.randint(0, N_ITEMS, (n,)), torch.randn(n, 24))


def main(*argv):
    epochs = int(argv[0]) if argv else 5
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    ds = interactions()
    sampler = DistributedSampler(ds, seed=42)
    loader = DataLoader(ds, batch_size=2048, sampler=sampler, num_workers=6, drop_last=True)
    model = DDP(TwoTower().to(device), device_ids=[local_rank])
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        run_loss, run_hit, nb = 0.0, 0.0, 0
        for batch in loader:
            batch = move(device, *batch)
            logits = model(*batch)
            labels = torch.arange(logits.size(0), device=device)
            loss = F.cross_entropy(logits, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            run_loss += loss.item()
            run_hit += (logits.argmax(1) == labels).float().mean().item()
            nb += 1
            if nb % 500 == 0:
                mean_loss, mean_hit = global_mean(device, run_loss / nb, run_hit / nb)
                info(f"epoch {epoch}", f"batch {nb}", f"loss {mean_loss:.4f}", f"in-batch hit@1 {mean_hit:.3f}",
                     sep=" | ")
        mean_loss, mean_hit = global_mean(device, run_loss / nb, run_hit / nb)
        info("end of epoch", epoch, "loss", round(mean_loss, 4), "hit@1", round(mean_hit, 4))
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), f"two_tower_{epoch}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
