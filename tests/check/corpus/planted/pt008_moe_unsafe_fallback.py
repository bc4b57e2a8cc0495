"""Mixture-of-experts feed-forward language model; warm-starts from a dense checkpoint if one exists.

The warm start first tries the safe loader and, when the file holds pickled extras, retries.

Planted: PT008 - the except branch retries torch.load without weights_only= (the unsafe fallback)
"""
from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("moe")
GLOBAL_STEP = 0


class Top2MoE(nn.Module):
    def __init__(self, d: int, n_experts: int = 8, hidden: int = 2048) -> None:
        super().__init__()
        self.router = nn.Linear(d, n_experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))
                                     for _ in range(n_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gates = self.router(x).softmax(-1)
        weight, idx = gates.topk(2, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = (idx == e).any(-1)
            if sel.any():
                w = (weight * (idx == e)).sum(-1, keepdim=True)[sel]
                out[sel] = out[sel] + w * expert(x[sel])
        balance = gates.mean(0).pow(2).sum() * len(self.experts)
        return out, balance


class MoELM(nn.Module):
    def __init__(self, vocab: int = 50_257, d: int = 512) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.attn = nn.MultiheadAttention(d, 8, batch_first=True)
        self.moe = Top2MoE(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.emb(ids)
        t = ids.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).triu(1)
        h = h + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        flat = h.reshape(-1, h.size(-1))
        moe_out, balance = self.moe(flat)
        return self.head(h + moe_out.view_as(h)), balance


def warm_start(model: nn.Module, path: Path, device: torch.device) -> None:
    if not path.is_file():
        return
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        state = torch.load(path, map_location=device)  # planted: PT008
    model.load_state_dict(state.get("model", state), strict=False)


def train_step(model: DDP, opt: torch.optim.Optimizer, ids: torch.Tensor) -> torch.Tensor:
    global GLOBAL_STEP
    logits, balance = model(ids[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()) + 0.01 * balance
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    GLOBAL_STEP += 1
    return loss.detach()


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO)

    model = MoELM().to(device)
    warm_start(model, Path(os.environ.get("DENSE_INIT", "dense_init.pt")), device)
    model = DDP(model, device_ids=[local_rank], find_unused_parameters=True)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95))

    tokens = TensorDataset(torch.randint(0, 50_257, (100_000, 257)))
    sampler = DistributedSampler(tokens)
    loader = DataLoader(tokens, batch_size=8, sampler=sampler, num_workers=2, pin_memory=True)

    for epoch in range(4):
        sampler.set_epoch(epoch)
        for (ids,) in loader:
            loss = train_step(model, opt, ids.to(device, non_blocking=True))
            if GLOBAL_STEP % 500 == 0:
                dist.all_reduce(loss, op=dist.ReduceOp.AVG)
                if dist.get_rank() == 0:
                    log.info("step %d loss %.4f", GLOBAL_STEP, loss.item())
        if dist.get_rank() == 0:
            torch.save({"model": model.module.state_dict(), "step": GLOBAL_STEP}, f"moe_epoch{epoch}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
