"""Sequence classification fine-tuning, a *_no_trainer example rewritten on plain torch DDP.

Planted: PT011 - dist.gather_object() for the prediction dump runs only under `case 0` of a match on the rank
"""
import argparse
import json
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding


@contextmanager
def torch_distributed_zero_first(local_rank: int):
    if local_rank not in [-1, 0]:
        dist.barrier()
    yield
    if local_rank == 0:
        dist.barrier()


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_name_or_path", default="bert-base-uncased")
    parser.add_argument("--task_name", default="sst2")
    parser.add_argument("--per_device_train_batch_size", type=int, default=32)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=2e-5)
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--output_dir", default="out")
    return parser.parse_args()


def main():
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    world_size = dist.get_world_size()
    device = torch.device("cuda", local_rank)

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    with torch_distributed_zero_first(local_rank):
        raw = load_dataset("glue", args.task_name)
        tokenized = raw.map(lambda ex: tokenizer(ex["sentence"], truncation=True, max_length=128),
                            batched=True, remove_columns=["sentence", "idx"])
    tokenized = tokenized.rename_column("label", "labels")
    collator = DataCollatorWithPadding(tokenizer)

    train_ds, eval_ds = tokenized["train"], tokenized["validation"]
    train_sampler = DistributedSampler(train_ds)
    eval_sampler = DistributedSampler(eval_ds, shuffle=False)
    train_dataloader = DataLoader(train_ds, sampler=train_sampler, collate_fn=collator,
                                  batch_size=args.per_device_train_batch_size)
    eval_dataloader = DataLoader(eval_ds, sampler=eval_sampler, collate_fn=collator,
                                 batch_size=args.per_device_eval_batch_size)

    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, num_labels=2)
    model.to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)

    for epoch in range(args.num_train_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            outputs.loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        model.eval()
        local_preds = []
        for batch in eval_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                logits = model(**batch).logits
            local_preds.extend(logits.argmax(dim=-1).tolist())

        match dist.get_rank():
            case 0:
                gathered = [None] * world_size
                dist.gather_object(local_preds, gathered, dst=0)  # planted: PT011
                os.makedirs(args.output_dir, exist_ok=True)
                with open(os.path.join(args.output_dir, f"preds_epoch{epoch}.json"), "w") as f:
                    json.dump(gathered, f)
            case _:
                pass

    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), os.path.join(args.output_dir, "pytorch_model.bin"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
