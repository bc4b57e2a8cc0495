"""Fine-tune a sequence classifier on GLUE with plain torch DDP (run_glue_no_trainer rewritten without Accelerate).

Planted: PT002 - each value of batch.items() gets a bare v.to(device); the dict keeps the CPU tensors.
"""
import argparse
import math
import os

import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, get_scheduler


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--task_name", default="mrpc")
    parser.add_argument("--model_name_or_path", default="bert-base-cased")
    parser.add_argument("--per_device_train_batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=2e-5)
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--output_dir", default="out")
    return parser.parse_args()


def main():
    args = parse_args()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    raw = load_dataset("glue", args.task_name)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)

    def preprocess(examples):
        out = tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=128)
        out["labels"] = examples["label"]
        return out

    processed = raw.map(preprocess, batched=True, remove_columns=raw["train"].column_names)
    collator = DataCollatorWithPadding(tokenizer)
    train_sampler = DistributedSampler(processed["train"], seed=42)
    eval_sampler = DistributedSampler(processed["validation"], shuffle=False)
    train_dataloader = DataLoader(processed["train"], sampler=train_sampler, collate_fn=collator, batch_size=args.per_device_train_batch_size)
    eval_dataloader = DataLoader(processed["validation"], sampler=eval_sampler, collate_fn=collator, batch_size=64)

    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, num_labels=2)
    model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    max_train_steps = args.num_train_epochs * math.ceil(len(train_dataloader))
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0, num_training_steps=max_train_steps)

    for epoch in range(args.num_train_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for step, batch in enumerate(train_dataloader):
            for k, v in batch.items():
                v.to(device)  # planted: PT002
            outputs = model(**batch)
            outputs.loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()

        model.eval()
        counts = torch.zeros(2, device=device)
        for batch in eval_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                predictions = model(**batch).logits.argmax(dim=-1)
            counts[0] += (predictions == batch["labels"]).sum()
            counts[1] += batch["labels"].numel()
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: accuracy {(counts[0] / counts[1]).item():.4f}")

    if dist.get_rank() == 0:
        model.module.save_pretrained(args.output_dir)
        tokenizer.save_pretrained(args.output_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
