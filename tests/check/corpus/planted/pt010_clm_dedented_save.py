"""Causal-LM fine-tuning (run_clm_no_trainer rewritten on plain torch DDP) with gradient accumulation.

Planted: PT010 - the best-model torch.save sits after the rank-0 `if`, under an is-best test only, so every rank writes the same file.
"""
import argparse
import logging
import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForCausalLM, AutoTokenizer, default_data_collator, get_scheduler

logger = logging.getLogger(__name__)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model_name_or_path", default="gpt2")
    p.add_argument("--dataset_name", default="wikitext")
    p.add_argument("--dataset_config_name", default="wikitext-2-raw-v1")
    p.add_argument("--per_device_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=4)
    p.add_argument("--num_train_epochs", type=int, default=3)
    p.add_argument("--lr_scheduler_type", default="cosine")
    p.add_argument("--output_dir", default="clm_out")
    return p.parse_args()


def main():
    args = parse_args()
    logging.basicConfig(level=logging.INFO)
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    if (rank := dist.get_rank()) == 0:
        os.makedirs(args.output_dir, exist_ok=True)
    dist.barrier()

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    raw = load_dataset(args.dataset_name, args.dataset_config_name)
    block = 512

    def group_texts(examples):
        ids = sum(tokenizer(examples["text"])["input_ids"], [])
        total = (len(ids) // block) * block
        chunks = [ids[i:i + block] for i in range(0, total, block)]
        return {"input_ids": chunks, "labels": [c[:] for c in chunks]}

    lm = raw.map(group_texts, batched=True, remove_columns=raw["train"].column_names)
    train_sampler = DistributedSampler(lm["train"])
    eval_sampler = DistributedSampler(lm["validation"], shuffle=False)
    train_dataloader = DataLoader(lm["train"], sampler=train_sampler, collate_fn=default_data_collator, batch_size=args.per_device_batch_size)
    eval_dataloader = DataLoader(lm["validation"], sampler=eval_sampler, collate_fn=default_data_collator, batch_size=args.per_device_batch_size)

    model = DDP(AutoModelForCausalLM.from_pretrained(args.model_name_or_path).to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0)
    updates = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps) * args.num_train_epochs
    match args.lr_scheduler_type:
        case "cosine" | "linear" as kind:
            lr_scheduler = get_scheduler(kind, optimizer=optimizer, num_warmup_steps=100, num_training_steps=updates)
        case _:
            lr_scheduler = get_scheduler("constant", optimizer=optimizer)

    best_ppl = float("inf")
    for epoch in range(args.num_train_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            sync = (step + 1) % args.gradient_accumulation_steps == 0
            ctx = model.no_sync() if not sync else nullcontext()
            with ctx:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(**batch).loss
                loss = loss / args.gradient_accumulation_steps
                loss.backward()
            if sync:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

        model.eval()
        sums = torch.zeros(2, device=device)
        for batch in eval_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                sums[0] += model(**batch).loss * batch["input_ids"].size(0)
            sums[1] += batch["input_ids"].size(0)
        dist.all_reduce(sums)
        perplexity = math.exp((sums[0] / sums[1]).item())
        if rank == 0:
            logger.info("epoch %d: perplexity %.2f", epoch, perplexity)
        torch.save(torch.cuda.get_rng_state(), os.path.join(args.output_dir, f"rng_state_{rank}.pth"))
        if perplexity < best_ppl:
            best_ppl = perplexity
            torch.save(model.module.state_dict(), os.path.join(args.output_dir, "best_model.bin"))  # planted: PT010
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
