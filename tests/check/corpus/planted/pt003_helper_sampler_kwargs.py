"""Contrastive (SimCLR-style) pretraining on STL-10 with DDP; loaders share one kwargs dict.

Planted: PT003 - train_sampler comes from the make_sampler() helper but is left out of the train DataLoader.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def make_sampler(dataset, shuffle):
    return DistributedSampler(dataset, shuffle=shuffle, drop_last=True)


class TwoViews:
    def __init__(self, tf):
        self.tf = tf

    def __call__(self, x):
        return self.tf(x), self.tf(x)


def nt_xent(z1, z2, temperature=0.5):
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.t() / temperature
    sim.fill_diagonal_(float("-inf"))
    n = z1.size(0)
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(sim, targets)


def main(epochs=100, batch_size=256):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    tf = torchvision.transforms.Compose([torchvision.transforms.RandomResizedCrop(96), torchvision.transforms.ToTensor()])
    train_set = torchvision.datasets.STL10("data", split="unlabeled", transform=TwoViews(tf))
    probe_set = torchvision.datasets.STL10("data", split="test", transform=torchvision.transforms.ToTensor())

    loader_kwargs = {"batch_size": batch_size, "num_workers": 8, "pin_memory": True, "drop_last": True}
    train_sampler = make_sampler(train_set, shuffle=True)  # planted: PT003
    probe_sampler = make_sampler(probe_set, shuffle=False)
    train_loader = DataLoader(train_set, **loader_kwargs)
    probe_loader = DataLoader(probe_set, sampler=probe_sampler, **loader_kwargs)

    backbone = torchvision.models.resnet18(num_classes=128)
    model = nn.parallel.DistributedDataParallel(backbone.to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4, weight_decay=1e-6)

    for epoch in range(epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for (x1, x2), _ in train_loader:
            x1 = x1.to(device, non_blocking=True)
            x2 = x2.to(device, non_blocking=True)
            loss = nt_xent(model(x1), model(x2))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        model.eval()
        norms = torch.zeros(2, device=device)
        with torch.no_grad():
            for images, _ in probe_loader:
                feats = model(images.to(device))
                norms[0] += feats.norm(dim=1).sum()
                norms[1] += feats.size(0)
        dist.all_reduce(norms)
        if rank == 0:
            print(f"epoch {epoch}: mean feature norm {(norms[0] / norms[1]).item():.3f}")
            torch.save(model.module.state_dict(), "simclr_resnet18.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
