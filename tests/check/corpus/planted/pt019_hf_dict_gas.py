"""Masked-LM fine-tuning, an *_no_trainer example ported to plain torch DDP (aliased tdist).

Planted: PT019 - outputs.loss is backpropagated undivided while updates happen every gradient_accumulation_steps
"""
import argparse
import math
import os

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForMaskedLM, AutoTokenizer, DataCollatorForLanguageModeling, get_scheduler

from mlm_corpus import tokenized_wikitext


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_name_or_path", default="roberta-base")
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--num_warmup_steps", type=int, default=0)
    parser.add_argument("--output_dir", default="mlm_out")
    return parser.parse_args()


def main():
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    tdist.init_process_group(backend="nccl")
    is_main_process = tdist.get_rank() == 0
    device = torch.device("cuda", local_rank)

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    train_dataset = tokenized_wikitext(tokenizer, max_seq_length=512)
    collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm_probability=0.15)
    sampler = DistributedSampler(train_dataset)
    train_dataloader = DataLoader(train_dataset, sampler=sampler, collate_fn=collator,
                                  batch_size=args.per_device_train_batch_size)

    model = AutoModelForMaskedLM.from_pretrained(args.model_name_or_path).to(device)
    model = DDP(model, device_ids=[local_rank])
    no_decay = ["bias", "LayerNorm.weight"]
    grouped = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(grouped, lr=args.learning_rate)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=args.num_warmup_steps,
                                 num_training_steps=max_train_steps)

    completed_steps = 0
    for epoch in range(args.num_train_epochs):
        sampler.set_epoch(epoch)
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()  # planted: PT019
            if step % args.gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
                completed_steps += 1
                if is_main_process and completed_steps % 100 == 0:
                    print(f"epoch {epoch} update {completed_steps}/{max_train_steps} loss {loss.item():.4f}")

        if is_main_process:
            os.makedirs(args.output_dir, exist_ok=True)
            torch.save(model.module.state_dict(), os.path.join(args.output_dir, "pytorch_model.bin"))

    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
