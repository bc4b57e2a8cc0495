"""Summarization fine-tuning (T5) on plain DDP, shaped like run_summarization_no_trainer.

Planted: PT027 - lr_scheduler.step() is outside the accumulation `if`, so the warmup/decay runs gradient_accumulation_steps times too fast
"""
import argparse
import math
import os

import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq,
                          get_scheduler)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model_name_or_path", default="t5-small")
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=4)
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument("--num_train_epochs", type=int, default=3)
    p.add_argument("--num_warmup_steps", type=int, default=500)
    p.add_argument("--output_dir", default="t5_cnn")
    return p.parse_args()


def main():
    args = parse_args()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    is_main = dist.get_rank() == 0

    raw = load_dataset("cnn_dailymail", "3.0.0")
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)

    def preprocess(examples):
        inputs = ["summarize: " + doc for doc in examples["article"]]
        model_inputs = tokenizer(inputs, max_length=512, truncation=True)
        labels = tokenizer(text_target=examples["highlights"], max_length=128, truncation=True)
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    train_dataset = raw["train"].map(preprocess, batched=True, remove_columns=raw["train"].column_names)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model_name_or_path)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    train_sampler = DistributedSampler(train_dataset)
    train_dataloader = DataLoader(train_dataset, sampler=train_sampler, collate_fn=collator,
                                  batch_size=args.per_device_train_batch_size)

    model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler(name="linear", optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps,
                                 num_training_steps=max_train_steps)

    completed_steps = 0
    for epoch in range(args.num_train_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            loss = outputs.loss / args.gradient_accumulation_steps
            loss.backward()
            if step % args.gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                optimizer.step()
                optimizer.zero_grad()
                completed_steps += 1
            lr_scheduler.step()  # planted: PT027

            if completed_steps % 100 == 0 and step % args.gradient_accumulation_steps == 0:
                reported = outputs.loss.detach().clone()
                dist.all_reduce(reported, op=dist.ReduceOp.AVG)
                if is_main:
                    print(f"epoch {epoch} update {completed_steps} loss {reported.item():.4f} "
                          f"lr {lr_scheduler.get_last_lr()[0]:.2e}")

    if is_main:
        os.makedirs(args.output_dir, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.output_dir, "pytorch_model.bin"))
        tokenizer.save_pretrained(args.output_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
