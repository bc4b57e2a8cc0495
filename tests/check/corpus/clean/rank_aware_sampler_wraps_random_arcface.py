import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler


class ShardedRandom(Sampler[int]):
    """Draws a full permutation with RandomSampler, then keeps every world-th index."""

    def __init__(self, dataset, rank: int, world: int, seed: int = 0):
        self.dataset, self.rank, self.world, self.seed = dataset, rank, world, seed
        self.epoch = 0
        self.per_rank = math.ceil(len(dataset) / world)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        order = list(RandomSampler(self.dataset, generator=g))
        order += order[: self.per_rank * self.world - len(order)]
        return iter(order[self.rank::self.world])

    def __len__(self):
        return self.per_rank


class Faces(Dataset):
    def __init__(self, n=200_000, ids=10_000):
        self.n, self.ids = n, ids

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.randn(3, 112, 112, generator=torch.Generator().manual_seed(i)), i % self.ids


class ArcMargin(nn.Module):
    def __init__(self, dim, classes, s=64.0, m=0.5):
        super().__init__()
        self.w = nn.Parameter(torch.empty(classes, dim))
        nn.init.xavier_uniform_(self.w)
        self.s, self.m = s, m

    def forward(self, emb, label):
        cos = F.linear(F.normalize(emb), F.normalize(self.w)).clamp(-1 + 1e-7, 1 - 1e-7)
        theta = torch.acos(cos)
        target = torch.cos(theta + self.m)
        onehot = F.one_hot(label, cos.size(1)).bool()
        return self.s * torch.where(onehot, target, cos)


class FaceModel(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.backbone = torchvision.models.resnet34(num_classes=512)
        self.head = ArcMargin(512, classes)

    def forward(self, x, y):
        return self.head(self.backbone(x), y)


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    ds = Faces()
    sampler = ShardedRandom(ds, rank, world, seed=2024)
    loader = DataLoader(ds, batch_size=128, sampler=sampler, num_workers=8, pin_memory=True, drop_last=True)
    model = DDP(FaceModel(ds.ids).to(device), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [10, 18, 22], 0.1)

    for epoch in range(24):
        sampler.set_epoch(epoch)
        model.train()
        totals = torch.zeros(2, device=device)
        for img, label in loader:
            img, label = img.to(device, non_blocking=True), label.to(device, non_blocking=True)
            loss = F.cross_entropy(model(img, label), label)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            totals += torch.stack([loss.detach(), torch.ones((), device=device)])
        sched.step()
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch} arcface loss {(totals[0] / totals[1]).item():.3f}")
            torch.save(model.module.backbone.state_dict(), f"arcface_r34_e{epoch}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
