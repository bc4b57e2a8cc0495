"""Small GPT on a tokenized code corpus; a while loop evaluates every eval_interval steps and stops on a plateau.

Planted: PT025 - the plateau counter uses losses["val"] from estimate_loss(), which only sees this rank's random batches, and breaks the while loop
"""
import os

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, GPTConfig

batch_size = 16
block_size = 512
max_iters = 100_000
eval_interval = 500
eval_iters = 50
max_bad_evals = 4
lr = 3e-4

dist.init_process_group(backend="nccl")
rank = dist.get_rank()
local_rank = int(os.environ["LOCAL_RANK"])
device = f"cuda:{local_rank}"
torch.cuda.set_device(device)
master_process = rank == 0
torch.manual_seed(2024 + rank)

train_data = np.memmap("data/code/train.bin", dtype=np.uint16, mode="r")
val_data = np.memmap("data/code/val.bin", dtype=np.uint16, mode="r")


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


@torch.no_grad()
def estimate_loss(model):
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


model = GPT(GPTConfig(n_layer=8, n_head=8, n_embd=512, block_size=block_size, vocab_size=50304))
model.to(device)
model = DDP(model, device_ids=[local_rank])
optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)

iter_num = 0
best_val_loss = float("inf")
bad_evals = 0
X, Y = get_batch("train")
while iter_num < max_iters:
    if iter_num % eval_interval == 0 and iter_num > 0:
        losses = estimate_loss(model)
        val_avg = torch.tensor(losses["val"], device=device)
        dist.all_reduce(val_avg, op=dist.ReduceOp.AVG)
        if master_process:
            print(f"step {iter_num}: val loss (all ranks) {val_avg.item():.4f}")
        if losses["val"] < best_val_loss:
            best_val_loss = losses["val"]
            bad_evals = 0
            if master_process:
                torch.save({"model": model.module.state_dict(), "iter_num": iter_num}, "out/ckpt.pt")
        else:
            bad_evals += 1
        if bad_evals >= max_bad_evals: break  # planted: PT025

    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        _, loss = model(X, Y)
    X, Y = get_batch("train")
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1

dist.destroy_process_group()
