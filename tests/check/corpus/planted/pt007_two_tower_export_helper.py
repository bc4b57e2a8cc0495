"""Two-tower retrieval model (user/item towers, in-batch softmax) trained with DDP.

torchrun --nproc_per_node=4 train_two_tower.py --export-dir export/
Planted: PT007 - export_model() helper does torch.save(net, path) and is given model.module
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("two_tower")


class Tower(nn.Module):
    def __init__(self, n_ids, dim=64):
        super().__init__()
        self.emb = nn.EmbeddingBag(n_ids, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(dim, 128), nn.ReLU(), nn.Linear(128, dim))

    def forward(self, ids):
        return F.normalize(self.mlp(self.emb(ids)), dim=-1)


class TwoTower(nn.Module):
    def __init__(self, n_users, n_items):
        super().__init__()
        self.user_tower = Tower(n_users)
        self.item_tower = Tower(n_items)
        self.temperature = 0.05

    def forward(self, user_feats, item_feats):
        u, v = self.user_tower(user_feats), self.item_tower(item_feats)
        logits = u @ v.t() / self.temperature
        return F.cross_entropy(logits, torch.arange(u.size(0), device=u.device))


def export_model(net, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(net, path)  # planted: PT007


def main(args):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    users = torch.randint(0, args.n_users, (200000, 8))
    items = torch.randint(0, args.n_items, (200000, 4))
    ds = TensorDataset(users, items)
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=1024, sampler=sampler, num_workers=4, drop_last=True)

    model = DDP(TwoTower(args.n_users, args.n_items).to(device), device_ids=[local_rank])
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (u, i) in enumerate(loader):
            u, i = u.to(device, non_blocking=True), i.to(device, non_blocking=True)
            loss = model(u, i)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 200 == 0 and dist.get_rank() == 0:
                log.info("epoch %d step %d in-batch softmax loss %.4f", epoch, step, loss.item())

    if dist.get_rank() == 0:
        export_model(model.module, os.path.join(args.export_dir, "two_tower.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-users", type=int, default=100000)
    parser.add_argument("--n-items", type=int, default=50000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--export-dir", default="export")
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())
