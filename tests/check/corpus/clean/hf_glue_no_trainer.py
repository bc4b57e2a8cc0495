"""HF run_glue_no_trainer shape on plain DDP: or-guard on local_rank, predictions all_gathered for accuracy, fp16 scaler."""
import argparse
import os

import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, get_scheduler


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--task_name", default="mrpc")
    p.add_argument("--model_name_or_path", default="bert-base-cased")
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--output_dir", default="glue-out")
    return p.parse_args()


def gather_predictions(preds, refs, world_size):
    if world_size == 1:
        return preds, refs
    out_p = [torch.zeros_like(preds) for _ in range(world_size)]
    out_r = [torch.zeros_like(refs) for _ in range(world_size)]
    dist.all_gather(out_p, preds)
    dist.all_gather(out_r, refs)
    return torch.cat(out_p), torch.cat(out_r)


def main():
    args = parse_args()
    if args.local_rank != -1:
        torch.cuda.set_device(args.local_rank)
        dist.init_process_group(backend="nccl")
        device = torch.device("cuda", args.local_rank)
        world_size = dist.get_world_size()
    else:
        device = torch.device("cuda")
        world_size = 1
    main_proc = args.local_rank == -1 or dist.get_rank() == 0

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    raw = load_dataset("glue", args.task_name)
    processed = raw.map(lambda ex: tokenizer(ex["sentence1"], ex["sentence2"], truncation=True, max_length=128),
                        batched=True, remove_columns=["sentence1", "sentence2", "idx"])
    processed = processed.rename_column("label", "labels")
    train_ds, eval_ds = processed["train"], processed["validation"]
    if args.local_rank != -1:
        train_sampler = DistributedSampler(train_ds)
        eval_sampler = DistributedSampler(eval_ds, shuffle=False, drop_last=True)
    else:
        train_sampler, eval_sampler = RandomSampler(train_ds), SequentialSampler(eval_ds)
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    train_dl = DataLoader(train_ds, sampler=train_sampler, collate_fn=collator, batch_size=args.batch_size)
    eval_dl = DataLoader(eval_ds, sampler=eval_sampler, collate_fn=collator, batch_size=args.batch_size)

    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, num_labels=2)
    model.to(device)
    if args.local_rank != -1:
        model = DDP(model, device_ids=[args.local_rank], output_device=args.local_rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=0,
                              num_training_steps=args.epochs * len(train_dl))
    scaler = torch.amp.GradScaler("cuda")

    for epoch in range(args.epochs):
        if isinstance(train_sampler, DistributedSampler):
            train_sampler.set_epoch(epoch)
        model.train()
        for batch in train_dl:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                loss = model(**batch).loss
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            optimizer.zero_grad()
        model.eval()
        all_preds, all_refs = [], []
        for batch in eval_dl:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                logits = model(**batch).logits
            preds, refs = gather_predictions(logits.argmax(-1), batch["labels"], world_size)
            all_preds.append(preds)
            all_refs.append(refs)
        accuracy = (torch.cat(all_preds) == torch.cat(all_refs)).float().mean().item()
        if main_proc:
            print(f"epoch {epoch}: accuracy {accuracy:.4f}")

    if args.local_rank == -1 or dist.get_rank() == 0:
        unwrapped = model.module if hasattr(model, "module") else model
        unwrapped.save_pretrained(args.output_dir)
        torch.save(optimizer.state_dict(), os.path.join(args.output_dir, "optimizer.pt"))
    if args.local_rank != -1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
