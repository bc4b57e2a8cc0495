"""Causal-LM fine-tuning in the shape of run_clm_no_trainer, rewritten on torch DDP.

Planted: PT022 - optimizer.zero_grad() sits after the accumulation `if`, so it runs on every micro-batch
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
from transformers import AutoModelForCausalLM, AutoTokenizer, default_data_collator, get_scheduler


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model_name_or_path", default="gpt2")
    p.add_argument("--dataset_name", default="wikitext")
    p.add_argument("--dataset_config_name", default="wikitext-2-raw-v1")
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=8)
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--num_train_epochs", type=int, default=3)
    p.add_argument("--block_size", type=int, default=512)
    p.add_argument("--output_dir", default="clm_out")
    return p.parse_args()


def main():
    args = parse_args()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    is_main_process = dist.get_rank() == 0

    raw_datasets = load_dataset(args.dataset_name, args.dataset_config_name)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    tokenized = raw_datasets.map(lambda ex: tokenizer(ex["text"]), batched=True, remove_columns=["text"])

    def group_texts(examples):
        concatenated = {k: sum(examples[k], []) for k in examples.keys()}
        total_length = (len(concatenated["input_ids"]) // args.block_size) * args.block_size
        result = {k: [t[i:i + args.block_size] for i in range(0, total_length, args.block_size)]
                  for k, t in concatenated.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    lm_datasets = tokenized.map(group_texts, batched=True)
    train_dataset = lm_datasets["train"]
    train_sampler = DistributedSampler(train_dataset)
    train_dataloader = DataLoader(train_dataset, sampler=train_sampler, collate_fn=default_data_collator,
                                  batch_size=args.per_device_train_batch_size)

    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path).to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=100,
                                 num_training_steps=max_train_steps)

    completed_steps = 0
    for epoch in range(args.num_train_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        total_loss = torch.zeros(2, device=device)
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                outputs = model(**batch)
            loss = outputs.loss
            total_loss[0] += loss.detach().float()
            total_loss[1] += 1
            loss = loss / args.gradient_accumulation_steps
            loss.backward()
            if (step + 1) % args.gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                completed_steps += 1
            optimizer.zero_grad()  # planted: PT022

        dist.all_reduce(total_loss)
        train_loss = (total_loss[0] / total_loss[1]).item()
        if is_main_process:
            print(f"epoch {epoch}: train_loss {train_loss:.4f} perplexity {math.exp(train_loss):.2f} "
                  f"steps {completed_steps}")

    if is_main_process:
        os.makedirs(args.output_dir, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.output_dir, "pytorch_model.bin"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
