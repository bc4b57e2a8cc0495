import math
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as ckpt_util
from torch.nn.parallel import DistributedDataParallel as DDP


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=50304, ctx=1024, d=768, h=12, n=12, recompute=True):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(n))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.recompute = recompute

    def forward(self, idx):
        t = idx.size(1)
        mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), 1)
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            if self.recompute and self.training:
                x = ckpt_util.checkpoint(blk, x, mask, use_reentrant=False)
            else:
                x = blk(x, mask)
        return self.lm_head(self.ln_f(x))

    @torch.no_grad()
    def generate(self, idx, steps, temperature=0.8):
        for _ in range(steps):
            logits = self(idx[:, -1024:])[:, -1] / temperature
            idx = torch.cat([idx, torch.multinomial(logits.softmax(-1), 1)], 1)
        return idx


def get_batch(data, bs, ctx, device, gen):
    ix = torch.randint(len(data) - ctx - 1, (bs,), generator=gen)
    x = torch.stack([torch.from_numpy(data[i:i + ctx].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + ctx].astype(np.int64)) for i in ix])
    return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)


def lr_at(it, warmup=2000, total=100_000, peak=6e-4, floor=6e-5):
    if it < warmup:
        return peak * (it + 1) / warmup
    ratio = min(1.0, (it - warmup) / (total - warmup))
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * ratio))


def main():
    dist.init_process_group(backend="nccl")
    ddp_rank, ddp_local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0
    torch.backends.cuda.matmul.allow_tf32 = True

    data = np.memmap("data/openwebtext/train.bin", dtype=np.uint16, mode="r")
    gen = torch.Generator().manual_seed(1337 + ddp_rank)
    raw_model = GPT().to(device)
    ddp_model = DDP(raw_model, device_ids=[ddp_local_rank])
    model = torch.compile(ddp_model)
    opt = torch.optim.AdamW(raw_model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)

    for it in range(100_000):
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        x, y = get_batch(data, 12, 1024, device, gen)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

        if it % 100 == 0:
            mean_loss = loss.detach()
            dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
            if master_process:
                print(f"iter {it}: loss {mean_loss.item():.4f}, lr {lr_at(it):.2e}")
        if it > 0 and it % 5000 == 0 and master_process:
            raw_model.eval()
            prompt = torch.zeros((1, 1), dtype=torch.long, device=device)
            sample = ddp_model.module.generate(prompt, 64)
            print("sample ids:", sample[0, :16].tolist())
            raw_model.train()
            torch.save({"model": raw_model.state_dict(), "optimizer": opt.state_dict(), "iter": it},
                       "out/ckpt.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
