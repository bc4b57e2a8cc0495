"""Abstractive summarization fine-tuning (T5 on XSum) with gradient accumulation under DDP.

Planted: PT022 - optimizer.zero_grad() at the top of every micro-batch while step() only runs every accum steps
"""
import argparse
import os

import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, get_linear_schedule_with_warmup


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="t5-small")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accum", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    raw = load_dataset("EdinburghNLP/xsum", split="train")

    def collate(rows):
        enc = tokenizer(["summarize: " + r["document"] for r in rows], max_length=512,
                        truncation=True, padding=True, return_tensors="pt")
        labels = tokenizer([r["summary"] for r in rows], max_length=64, truncation=True,
                           padding=True, return_tensors="pt").input_ids
        labels[labels == tokenizer.pad_token_id] = -100
        enc["labels"] = labels
        return enc

    sampler = DistributedSampler(raw)
    loader = DataLoader(raw, batch_size=args.batch_size, sampler=sampler, collate_fn=collate, num_workers=4)

    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    updates = args.epochs * len(loader) // args.accum
    scheduler = get_linear_schedule_with_warmup(optimizer, 500, updates)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for step, batch in enumerate(loader):
            optimizer.zero_grad()  # planted: PT022
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch).loss / args.accum
            loss.backward()
            if (step + 1) % args.accum == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()

        if dist.get_rank() == 0:
            model.module.save_pretrained(f"t5-xsum/epoch-{epoch}")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
