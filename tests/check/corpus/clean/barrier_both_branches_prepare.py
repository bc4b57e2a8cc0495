"""Data-preparation shape: rank 0 downloads/tokenises while the others wait, with a barrier in both branches, then every rank loads."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

CACHE = "cache/tokens.pt"


def prepare_tokens(raw_path, cache_path):
    from tokenizer import encode_file
    ids = torch.tensor(encode_file(raw_path), dtype=torch.long)
    os.makedirs(os.path.dirname(cache_path), exist_ok=True)
    torch.save(ids, cache_path)


def main(model_fn, raw_path="corpus.txt", seq_len=256, epochs=3):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)

    if rank == 0:
        if not os.path.exists(CACHE):
            prepare_tokens(raw_path, CACHE)
        dist.barrier()
    else:
        dist.barrier()
    ids = torch.load(CACHE, map_location="cpu", weights_only=True)
    n = (ids.numel() - 1) // seq_len
    x = ids[: n * seq_len].view(n, seq_len)
    y = ids[1: n * seq_len + 1].view(n, seq_len)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    model = DDP(model_fn().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            logits = model(xb)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), yb.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total[0] += loss.detach()
            total[1] += 1
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: mean loss {(total[0] / total[1]).item():.4f}")
    if rank == 0:
        torch.save(model.module.state_dict(), "lm_from_cache.pt")
    dist.destroy_process_group()
