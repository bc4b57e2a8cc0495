"""nanoGPT resume shape: init_from='resume' loading a ckpt with the _orig_mod. prefix stripped, torch.compile, walrus rank guard."""
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, GPTConfig

out_dir = "out-shakespeare"
init_from = "resume"
compile_model = True
max_iters = 5000
eval_interval = 250
grad_accum = 8

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
world_size = dist.get_world_size()
device = torch.device("cuda", local_rank)
ctx = torch.autocast(device_type="cuda", dtype=torch.bfloat16)

iter_num = 0
best_val_loss = float("inf")
if init_from == "resume":
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    checkpoint = torch.load(ckpt_path, map_location=device, weights_only=True)
    model = GPT(GPTConfig(**checkpoint["model_args"]))
    state_dict = checkpoint["model"]
    unwanted_prefix = "_orig_mod."
    for k in list(state_dict.keys()):
        if k.startswith(unwanted_prefix):
            state_dict[k[len(unwanted_prefix):]] = state_dict.pop(k)
    model.load_state_dict(state_dict)
    iter_num = checkpoint["iter_num"]
    best_val_loss = checkpoint["best_val_loss"]
else:
    model = GPT(GPTConfig())
    checkpoint = None
model = model.to(device)
optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cuda")
if checkpoint is not None:
    optimizer.load_state_dict(checkpoint["optimizer"])
checkpoint = None
if compile_model:
    model = torch.compile(model)
model = DDP(model, device_ids=[local_rank])
raw_model = model.module


def get_batch(split):
    data = torch.load(os.path.join(out_dir, f"{split}_tokens.pt"), map_location="cpu", weights_only=True)
    ix = torch.randint(len(data) - 256, (16,))
    x = torch.stack([data[i:i + 256] for i in ix]).to(device, non_blocking=True)
    y = torch.stack([data[i + 1:i + 257] for i in ix]).to(device, non_blocking=True)
    return x, y


@torch.no_grad()
def val_loss(iters=50):
    model.eval()
    total = torch.zeros(1, device=device)
    for _ in range(iters):
        x, y = get_batch("val")
        with ctx:
            _, loss = model(x, y)
        total += loss
    model.train()
    total /= iters
    dist.all_reduce(total)
    return (total / world_size).item()


while iter_num < max_iters:
    if iter_num % eval_interval == 0:
        vl = val_loss()
        if (rank := dist.get_rank()) == 0:
            print(f"step {iter_num}: val loss {vl:.4f}")
            if vl < best_val_loss:
                best_val_loss = vl
                torch.save({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                            "model_args": raw_model.config.__dict__, "iter_num": iter_num,
                            "best_val_loss": best_val_loss}, os.path.join(out_dir, "ckpt.pt"))
    for micro in range(grad_accum):
        x, y = get_batch("train")
        sync_ctx = model.no_sync() if micro < grad_accum - 1 else nullcontext()
        with sync_ctx:
            with ctx:
                _, loss = model(x, y)
            (loss / grad_accum).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1

dist.destroy_process_group()
