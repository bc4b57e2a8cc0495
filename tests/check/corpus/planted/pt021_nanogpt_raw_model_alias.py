"""Character-level GPT pretraining loop in the nanoGPT style (torchrun, memmapped tokens).

Planted: PT021 - the training forward goes through raw_model = model.module instead of the DDP wrapper
"""
import math
import os
import time
from contextlib import nullcontext

import numpy as np
import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, GPTConfig

out_dir = "out"
data_dir = os.path.join("data", "shakespeare_char")
batch_size = 12
block_size = 256
max_iters = 5000
eval_interval = 250
eval_iters = 100
log_interval = 10
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 200
lr_decay_iters = 5000
grad_clip = 1.0

init_process_group(backend="nccl")
ddp_rank = int(os.environ["RANK"])
ddp_local_rank = int(os.environ["LOCAL_RANK"])
ddp_world_size = int(os.environ["WORLD_SIZE"])
device = f"cuda:{ddp_local_rank}"
torch.cuda.set_device(device)
master_process = ddp_rank == 0
torch.manual_seed(1337 + ddp_rank)
ctx = torch.autocast(device_type="cuda", dtype=torch.bfloat16)


def get_batch(split):
    name = "train.bin" if split == "train" else "val.bin"
    data = np.memmap(os.path.join(data_dir, name), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    x = x.pin_memory().to(device, non_blocking=True)
    y = y.pin_memory().to(device, non_blocking=True)
    return x, y


@torch.no_grad()
def estimate_loss(model):
    out = {}
    model.eval()
    for split in ("train", "val"):
        losses = torch.zeros(eval_iters, device=device)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                _, loss = model(X, Y)
            losses[k] = loss
        mean = losses.mean()
        torch.distributed.all_reduce(mean, op=torch.distributed.ReduceOp.AVG)
        out[split] = mean.item()
    model.train()
    return out


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


model = GPT(GPTConfig(block_size=block_size, vocab_size=65, n_layer=6, n_head=6, n_embd=384))
model.to(device)
optimizer = model.configure_optimizers(0.1, learning_rate, (0.9, 0.99), "cuda")
model = DDP(model, device_ids=[ddp_local_rank])
raw_model = model.module

if master_process:
    os.makedirs(out_dir, exist_ok=True)

X, Y = get_batch("train")
t0 = time.time()
iter_num = 0
best_val_loss = 1e9
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr

    if iter_num % eval_interval == 0:
        losses = estimate_loss(model)
        if master_process:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            if losses["val"] < best_val_loss:
                best_val_loss = losses["val"]
                checkpoint = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                              "iter_num": iter_num, "best_val_loss": best_val_loss}
                torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))

    with ctx:
        logits, loss = raw_model(X, Y)  # planted: PT021
    X, Y = get_batch("train")
    loss.backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0 and master_process:
        print(f"iter {iter_num}: time {dt * 1000:.2f}ms, lr {lr:.2e}")
    iter_num += 1
    if iter_num > max_iters:
        break

destroy_process_group()
