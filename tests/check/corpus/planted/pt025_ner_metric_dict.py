"""Token-classification (NER) fine-tuning, run_ner_no_trainer rewritten on torch DDP, with early stopping on F1.

Planted: PT025 - the stop decision reads eval_metric["f1"], computed from this rank's shard only, and breaks the epoch loop
"""
import argparse
import os

import torch
import torch.distributed as dist
from datasets import load_dataset
from seqeval.metrics import f1_score
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import (AutoModelForTokenClassification, AutoTokenizer,
                          DataCollatorForTokenClassification, get_linear_schedule_with_warmup)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model_name_or_path", default="bert-base-cased")
    p.add_argument("--num_train_epochs", type=int, default=20)
    p.add_argument("--early_stopping_patience", type=int, default=3)
    p.add_argument("--per_device_batch_size", type=int, default=16)
    return p.parse_args()


def main():
    args = parse_args()
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    raw = load_dataset("conll2003")
    label_list = raw["train"].features["ner_tags"].feature.names
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)

    def tokenize_and_align(examples):
        enc = tokenizer(examples["tokens"], truncation=True, is_split_into_words=True)
        labels = []
        for i, tags in enumerate(examples["ner_tags"]):
            word_ids = enc.word_ids(batch_index=i)
            labels.append([-100 if w is None else tags[w] for w in word_ids])
        enc["labels"] = labels
        return enc

    processed = raw.map(tokenize_and_align, batched=True, remove_columns=raw["train"].column_names)
    collator = DataCollatorForTokenClassification(tokenizer)
    train_sampler = DistributedSampler(processed["train"])
    train_dataloader = DataLoader(processed["train"], sampler=train_sampler, collate_fn=collator,
                                  batch_size=args.per_device_batch_size)
    eval_dataloader = DataLoader(processed["validation"], collate_fn=collator, batch_size=64,
                                 sampler=DistributedSampler(processed["validation"], shuffle=False))

    model = AutoModelForTokenClassification.from_pretrained(args.model_name_or_path,
                                                            num_labels=len(label_list))
    model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, 0, args.num_train_epochs * len(train_dataloader))

    best_f1 = -1.0
    epochs_without_improvement = 0
    for epoch in range(args.num_train_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for batch in train_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()

        model.eval()
        y_true, y_pred = [], []
        for batch in eval_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                preds = model(**batch).logits.argmax(dim=-1)
            for p_row, l_row in zip(preds.tolist(), batch["labels"].tolist()):
                y_pred.append([label_list[p] for p, l in zip(p_row, l_row) if l != -100])
                y_true.append([label_list[l] for l in l_row if l != -100])
        eval_metric = {"f1": f1_score(y_true, y_pred), "epoch": epoch}
        print(f"[rank {rank}] epoch {epoch} shard f1 {eval_metric['f1']:.4f}")

        if eval_metric["f1"] > best_f1:
            best_f1 = eval_metric["f1"]
            epochs_without_improvement = 0
        else:
            epochs_without_improvement += 1
        if epochs_without_improvement >= args.early_stopping_patience: break  # planted: PT025

    if rank == 0:
        torch.save(model.module.state_dict(), "ner_model.bin")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
