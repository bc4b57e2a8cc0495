"""Trainer setup where rank 0 draws a random seed and shares it so all ranks initialise identically.

Planted: PT028 - dist.broadcast(seed_tensor, src=0) of a CPU torch.tensor([...]) in an nccl process group
"""
import os
import random
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class TrainingArgs:
    seed: int | None = None
    steps: int = 2000
    batch_size: int = 16
    lr: float = 3e-4
    vocab: int = 8192


def set_determinism(seed, device):
    if seed is None:
        seed = random.randint(0, 2**31 - 1) if dist.get_rank() == 0 else 0
    seed_tensor = torch.tensor([seed], dtype=torch.int64)
    dist.broadcast(seed_tensor, src=0)  # planted: PT028
    seed = int(seed_tensor.item())
    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)
    return seed


def main():
    args = TrainingArgs()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    set_determinism(args.seed, device)

    layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)
    model = nn.Sequential(nn.Embedding(args.vocab, 256), nn.TransformerEncoder(layer, 4), nn.Linear(256, args.vocab))
    model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    ds = TensorDataset(torch.randint(0, args.vocab, (20000, 129)))
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for (tokens,) in loader:
            tokens = tokens.to(device)
            loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % 100 == 0:
                avg = loss.detach().clone()
                dist.all_reduce(avg, op=dist.ReduceOp.AVG)
                if dist.get_rank() == 0:
                    print(f"step {step} loss {avg.item():.4f}")
            if step >= args.steps:
                break
        epoch += 1
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "final_model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
