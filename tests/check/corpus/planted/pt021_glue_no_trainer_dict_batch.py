"""Fine-tune a sequence classifier on a GLUE task with plain torch DDP (no Trainer, no Accelerate).

Planted: PT021 - the training step runs outputs = model.module(**batch), so gradients are never all-reduced
"""
import argparse
import math
import os

import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from transformers import (AutoModelForSequenceClassification, AutoTokenizer,
                          DataCollatorWithPadding, get_scheduler)


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--task_name", default="mrpc")
    parser.add_argument("--model_name_or_path", default="bert-base-cased")
    parser.add_argument("--per_device_train_batch_size", type=int, default=32)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=2e-5)
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--num_warmup_steps", type=int, default=0)
    parser.add_argument("--output_dir", default="glue_out")
    return parser.parse_args()


def main():
    args = parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    raw = load_dataset("glue", args.task_name)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)

    def tokenize(examples):
        return tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=128)

    processed = raw.map(tokenize, batched=True, remove_columns=["sentence1", "sentence2", "idx"])
    processed = processed.rename_column("label", "labels")
    train_ds, eval_ds = processed["train"], processed["validation"]

    collator = DataCollatorWithPadding(tokenizer)
    train_sampler = DistributedSampler(train_ds)
    eval_sampler = DistributedSampler(eval_ds, shuffle=False)
    train_dataloader = DataLoader(train_ds, sampler=train_sampler, collate_fn=collator,
                                  batch_size=args.per_device_train_batch_size)
    eval_dataloader = DataLoader(eval_ds, sampler=eval_sampler, collate_fn=collator,
                                 batch_size=args.per_device_eval_batch_size)

    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, num_labels=2)
    model.to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)

    no_decay = ["bias", "LayerNorm.weight"]
    grouped = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(grouped, lr=args.learning_rate)
    max_train_steps = args.num_train_epochs * math.ceil(len(train_dataloader))
    lr_scheduler = get_scheduler("linear", optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps,
                                 num_training_steps=max_train_steps)

    completed_steps = 0
    for epoch in range(args.num_train_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model.module(**batch)  # planted: PT021
            loss = outputs.loss
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            completed_steps += 1

        model.eval()
        counts = torch.zeros(2, device=device)
        for batch in eval_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                outputs = model.module(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            counts[0] += (predictions == batch["labels"]).sum()
            counts[1] += batch["labels"].numel()
        dist.all_reduce(counts)
        if rank == 0:
            print(f"epoch {epoch}: accuracy {(counts[0] / counts[1]).item():.4f} steps {completed_steps}")

    if rank == 0:
        os.makedirs(args.output_dir, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.output_dir, "pytorch_model.bin"))
        tokenizer.save_pretrained(args.output_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
