"""Translation-style training configured through dataclass config objects (cfg.common, cfg.distributed_training).

Planted: PT017 - cfg.distributed_training.distributed_backend defaults to "nccl" while cfg.common.cpu / no CUDA selects the CPU
"""
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class CommonConfig:
    cpu: bool = False
    seed: int = 1
    log_interval: int = 100


@dataclass
class DistributedTrainingConfig:
    distributed_backend: str = "nccl"
    distributed_init_method: str = "env://"


@dataclass
class OptimizationConfig:
    max_epoch: int = 20
    lr: float = 5e-4
    clip_norm: float = 0.1


@dataclass
class TrainConfig:
    common: CommonConfig = field(default_factory=CommonConfig)
    distributed_training: DistributedTrainingConfig = field(default_factory=DistributedTrainingConfig)
    optimization: OptimizationConfig = field(default_factory=OptimizationConfig)


def distributed_init(cfg):
    dist.init_process_group(backend=cfg.distributed_training.distributed_backend,  # planted: PT017
                            init_method=cfg.distributed_training.distributed_init_method)
    return dist.get_rank(), dist.get_world_size()


def build_model(vocab=8000, dim=256):
    return nn.Sequential(nn.Embedding(vocab, dim), nn.TransformerEncoder(
        nn.TransformerEncoderLayer(dim, 4, 1024, batch_first=True), 3), nn.Linear(dim, vocab))


def main(cfg):
    rank, world_size = distributed_init(cfg)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = torch.cuda.is_available() and not cfg.common.cpu
    if use_cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    torch.manual_seed(cfg.common.seed)

    src = torch.randint(0, 8000, (20000, 64))
    dataset = TensorDataset(src[:, :-1], src[:, 1:])
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=cfg.common.seed)
    itr = DataLoader(dataset, batch_size=32, sampler=sampler)

    model = build_model().to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.optimization.lr, betas=(0.9, 0.98))
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)

    epoch = 1
    while epoch <= cfg.optimization.max_epoch:
        sampler.set_epoch(epoch)
        model.train()
        for i, (tokens, target) in enumerate(itr):
            tokens, target = tokens.to(device), target.to(device)
            loss = criterion(model(tokens).flatten(0, 1), target.flatten())
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.optimization.clip_norm)
            optimizer.step()
            if i % cfg.common.log_interval == 0:
                stat = loss.detach().clone()
                dist.all_reduce(stat, op=dist.ReduceOp.SUM)
                stat /= world_size
                if rank == 0:
                    print(f"| epoch {epoch:03d} | {i:5d} / {len(itr)} | loss {stat.item():.3f}")
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, "checkpoint_last.pt")
        epoch += 1


if __name__ == "__main__":
    main(TrainConfig())
