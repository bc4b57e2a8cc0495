"""Contrastive sentence-embedding training (in-batch negatives) with gradient accumulation.

Planted: PT019 - backward on every batch, optimizer steps every accum_steps batches, loss never divided
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import AutoModel, AutoTokenizer, get_linear_schedule_with_warmup
from datasets import load_dataset


def mean_pool(hidden, mask):
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-6)


def info_nce(q, p, temperature=0.05):
    q = F.normalize(q, dim=-1)
    p = F.normalize(p, dim=-1)
    logits = q @ p.t() / temperature
    labels = torch.arange(q.size(0), device=q.device)
    return F.cross_entropy(logits, labels)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="distilroberta-base")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--accum-steps", type=int, default=4)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    tok = AutoTokenizer.from_pretrained(args.model)
    pairs = load_dataset("sentence-transformers/all-nli", "pair", split="train")

    def collate(rows):
        a = tok([r["anchor"] for r in rows], padding=True, truncation=True, max_length=64, return_tensors="pt")
        b = tok([r["positive"] for r in rows], padding=True, truncation=True, max_length=64, return_tensors="pt")
        return a, b

    sampler = DistributedSampler(pairs)
    loader = DataLoader(pairs, batch_size=args.batch_size, sampler=sampler, collate_fn=collate, drop_last=True)

    model = DDP(AutoModel.from_pretrained(args.model).to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    total = len(loader) * args.epochs // args.accum_steps
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.1 * total), total)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        optimizer.zero_grad()
        for i, (a, b) in enumerate(loader):
            a = {k: v.to(device) for k, v in a.items()}
            b = {k: v.to(device) for k, v in b.items()}
            qa = mean_pool(model(**a).last_hidden_state, a["attention_mask"])
            pb = mean_pool(model(**b).last_hidden_state, b["attention_mask"])
            loss = info_nce(qa, pb)
            loss.backward()  # planted: PT019
            if (i + 1) % args.accum_steps == 0:
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

    if dist.get_rank() == 0:
        model.module.save_pretrained("st-nli-contrastive")
        tok.save_pretrained("st-nli-contrastive")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
