"""GPT pretraining loop on a memory-mapped token file, nanoGPT style, under torchrun.

Planted: PT001 - the device string is built from RANK (global) instead of LOCAL_RANK.
"""
import math
import os
import time

import numpy as np
import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, GPTConfig

out_dir = "out"
data_dir = os.path.join("data", "openwebtext")
batch_size = 12
block_size = 1024
max_iters = 60000
eval_interval = 1000
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 2000
grad_clip = 1.0

init_process_group(backend="nccl")
ddp_rank = int(os.environ["RANK"])
ddp_local_rank = int(os.environ["LOCAL_RANK"])
ddp_world_size = int(os.environ["WORLD_SIZE"])
device = torch.device(f"cuda:{ddp_rank}")  # planted: PT001
master_process = ddp_rank == 0
seed_offset = ddp_rank
if master_process:
    os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(1337 + seed_offset)


def get_batch(split):
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    x = x.pin_memory().to(device, non_blocking=True)
    y = y.pin_memory().to(device, non_blocking=True)
    return x, y


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / (max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


@torch.no_grad()
def estimate_loss(model, eval_iters=200):
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(eval_iters, device=device)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                _, loss = model(X, Y)
            losses[k] = loss.item()
        mean = losses.mean()
        torch.distributed.all_reduce(mean, op=torch.distributed.ReduceOp.AVG)
        out[split] = mean.item()
    model.train()
    return out


model = GPT(GPTConfig(block_size=block_size)).to(device)
optimizer = model.configure_optimizers(0.1, learning_rate, (0.9, 0.95), "cuda")
model = DDP(model, device_ids=[ddp_local_rank])
raw_model = model.module

X, Y = get_batch("train")
t0 = time.time()
for iter_num in range(max_iters + 1):
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if iter_num % eval_interval == 0:
        losses = estimate_loss(model)
        if master_process:
            print(f"step {iter_num}: train {losses['train']:.4f} val {losses['val']:.4f}")
            ckpt = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num}
            torch.save(ckpt, os.path.join(out_dir, "ckpt.pt"))
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        logits, loss = model(X, Y)
    X, Y = get_batch("train")
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if master_process and iter_num % 100 == 0:
        dt = time.time() - t0
        t0 = time.time()
        print(f"iter {iter_num}: {dt * 1000:.1f}ms")

destroy_process_group()
