import enum
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


class Phase(enum.Enum):
    WARMUP = enum.auto()
    TRAIN = enum.auto()
    FINETUNE = enum.auto()
    DONE = enum.auto()


class Role(enum.IntEnum):
    LEADER = 0


def next_phase(phase: Phase, epoch: int) -> Phase:
    if phase is Phase.WARMUP and epoch >= 2:
        return Phase.TRAIN
    if phase is Phase.TRAIN and epoch >= 40:
        return Phase.FINETUNE
    if phase is Phase.FINETUNE and epoch >= 50:
        return Phase.DONE
    return phase


class TextLines(Dataset):
    def __len__(self):
        return 60_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        length = int(torch.randint(3, 12, (1,), generator=g))
        label = torch.randint(1, len(ALPHABET) + 1, (length,), generator=g)
        return torch.rand(1, 32, 128, generator=g), label


def collate(batch):
    imgs, labels = zip(*batch)
    return torch.stack(imgs), torch.cat(labels), torch.tensor([len(t) for t in labels])


class CRNN(nn.Module):
    def __init__(self, n_cls=len(ALPHABET) + 1):
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(1, 64, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 3, 1, 1), nn.BatchNorm2d(256), nn.ReLU(), nn.MaxPool2d((2, 1)),
            nn.Conv2d(256, 256, 3, 1, 1), nn.BatchNorm2d(256), nn.ReLU(), nn.MaxPool2d((4, 1)),
        )
        self.rnn = nn.LSTM(256, 256, 2, bidirectional=True)
        self.fc = nn.Linear(512, n_cls)

    def forward(self, x):
        f = self.cnn(x).squeeze(2).permute(2, 0, 1)
        return self.fc(self.rnn(f)[0]).log_softmax(-1)


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    gpu = rank % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    dev = torch.device("cuda", gpu)

    ds = TextLines()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank)
    loader = DataLoader(ds, batch_size=64, sampler=sampler, collate_fn=collate, num_workers=4)
    model = DDP(CRNN().to(dev), device_ids=[gpu])
    ctc = nn.CTCLoss(blank=0, zero_infinity=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    phase, epoch = Phase.WARMUP, 0
    while phase is not Phase.DONE:
        lr = {Phase.WARMUP: 1e-4, Phase.TRAIN: 1e-3, Phase.FINETUNE: 1e-4}[phase]
        for group in opt.param_groups:
            group["lr"] = lr
        sampler.set_epoch(epoch)
        model.train()
        agg = torch.zeros(2, device=dev)
        for imgs, targets, target_lens in loader:
            imgs = imgs.to(dev, non_blocking=True)
            targets, target_lens = targets.to(dev), target_lens.to(dev)
            logp = model(imgs)
            in_lens = torch.full((imgs.size(0),), logp.size(0), dtype=torch.long, device=dev)
            loss = ctc(logp.float(), targets, in_lens, target_lens)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5)
            opt.step()
            agg[0] += loss.detach()
            agg[1] += 1
        dist.all_reduce(agg)
        if rank == Role.LEADER:
            print(f"{phase.name.lower():>8} epoch {epoch} ctc {(agg[0] / agg[1]).item():.4f}")
            torch.save({"phase": phase.name, "epoch": epoch, "model": model.module.state_dict()},
                       f"crnn_{phase.name.lower()}.pt")
        epoch += 1
        phase = next_phase(phase, epoch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
