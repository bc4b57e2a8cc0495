from __future__ import annotations

import os
from typing import Final

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

NUM_WORDS: Final[int] = 35
SAMPLE_RATE: Final[int] = 16_000


class Commands(Dataset[tuple[Tensor, int]]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        g = torch.Generator().manual_seed(i)
        return torch.randn(1, SAMPLE_RATE, generator=g) * 0.1, i % NUM_WORDS


class M5(nn.Module):
    def __init__(self, n_out: int = NUM_WORDS, ch: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(1, ch, 80, stride=16), nn.BatchNorm1d(ch), nn.ReLU(), nn.MaxPool1d(4),
            nn.Conv1d(ch, ch, 3), nn.BatchNorm1d(ch), nn.ReLU(), nn.MaxPool1d(4),
            nn.Conv1d(ch, 2 * ch, 3), nn.BatchNorm1d(2 * ch), nn.ReLU(), nn.MaxPool1d(4),
            nn.Conv1d(2 * ch, 2 * ch, 3), nn.BatchNorm1d(2 * ch), nn.ReLU(),
            nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(2 * ch, n_out),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def train(model: nn.Module, *, loader: DataLoader, optimizer: torch.optim.Optimizer,
          device: torch.device, epoch: int) -> float:
    sampler = loader.sampler
    assert isinstance(sampler, DistributedSampler)
    sampler.set_epoch(epoch)
    model.train()
    totals = torch.zeros(2, device=device)
    for wav, label in loader:
        wav, label = wav.to(device), label.to(device)
        loss = F.cross_entropy(model(wav), label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        totals[0] += loss.detach() * label.size(0)
        totals[1] += label.size(0)
    dist.all_reduce(totals)
    return float(totals[0] / totals[1])


@torch.no_grad()
def evaluate(model: nn.Module, *, loader: DataLoader, device: torch.device) -> float:
    model.eval()
    correct = torch.zeros((), device=device, dtype=torch.long)
    count = torch.zeros((), device=device, dtype=torch.long)
    for wav, label in loader:
        wav, label = wav.to(device), label.to(device)
        correct += (model(wav).argmax(-1) == label).sum()
        count += label.numel()
    dist.all_reduce(correct)
    dist.all_reduce(count)
    return correct.item() / max(count.item(), 1)


def main() -> None:
    dist.init_process_group("nccl")
    local_rank: int = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    is_leader: bool = dist.get_rank() == 0

    train_set, val_set = Commands(85_000), Commands(10_000)
    train_loader = DataLoader(train_set, batch_size=256, sampler=DistributedSampler(train_set),
                              num_workers=4, pin_memory=True)
    val_loader = DataLoader(val_set, batch_size=512, sampler=DistributedSampler(val_set, shuffle=False))

    model: nn.Module = M5().to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.1)

    for epoch in range(1, 51):
        loss = train(model, loader=train_loader, optimizer=optimizer, device=device, epoch=epoch)
        acc = evaluate(model, loader=val_loader, device=device)
        scheduler.step()
        if is_leader:
            print(f"epoch {epoch:02d}  train loss {loss:.4f}  val acc {acc:.2%}")
    if is_leader:
        torch.save(model.module.state_dict(), "m5_kws.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
