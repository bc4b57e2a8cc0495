"""GPT-2 (124M) pretraining on OpenWebText shards, nanoGPT-style while loop with micro-steps.

Planted: PT023 - `with model.no_sync():` wraps the whole micro-step loop, so even the last backward never syncs
"""
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, GPTConfig

batch_size = 12
block_size = 1024
gradient_accumulation_steps = 40
max_iters = 600000
learning_rate = 6e-4
warmup_iters = 2000
eval_interval = 2000
eval_iters = 200
data_dir = "data/openwebtext"

dist.init_process_group(backend="nccl")
rank = dist.get_rank()
local_rank = int(os.environ["LOCAL_RANK"])
world_size = dist.get_world_size()
device = torch.device("cuda", local_rank)
torch.cuda.set_device(device)
master = rank == 0
gradient_accumulation_steps //= world_size
torch.manual_seed(1337 + rank)
amp_ctx = torch.autocast(device_type="cuda", dtype=torch.float16)


def get_batch(split):
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


@torch.no_grad()
def estimate_loss():
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(eval_iters, device=device)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with amp_ctx:
                _, loss = model(X, Y)
            losses[k] = loss.item()
        total = torch.stack([losses.sum(), torch.tensor(float(eval_iters), device=device)])
        dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    model.train()
    return out


def lr_at(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / warmup_iters
    progress = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return 0.1 * learning_rate + 0.45 * learning_rate * (1 + math.cos(math.pi * progress))


model = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=block_size))
model.to(device)
model = DDP(model, device_ids=[local_rank])
raw_model = model.module
optimizer = raw_model.configure_optimizers(0.1, learning_rate, (0.9, 0.95), "cuda")
scaler = torch.amp.GradScaler("cuda")

iter_num = 0
t0 = time.time()
X, Y = get_batch("train")
while iter_num <= max_iters:
    for group in optimizer.param_groups:
        group["lr"] = lr_at(iter_num)
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        if master:
            print(f"step {iter_num}: train {losses['train']:.4f} val {losses['val']:.4f}")
            torch.save({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                        "iter_num": iter_num}, "out/ckpt.pt")

    with model.no_sync():  # planted: PT023
        for micro_step in range(gradient_accumulation_steps):
            with amp_ctx:
                _, loss = model(X, Y)
                loss = loss / gradient_accumulation_steps
            X, Y = get_batch("train")
            scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    if master and iter_num % 10 == 0:
        t1 = time.time()
        print(f"iter {iter_num}: {(t1 - t0) * 100:.1f} ms/iter")
        t0 = t1
    iter_num += 1

dist.destroy_process_group()
