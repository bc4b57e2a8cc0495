"""Natural-language inference (MultiNLI) fine-tuning; predictions gathered from all ranks for macro-F1.

Planted: PT028 - the (pred, label) pairs are moved to the CPU with .cpu() and then passed to dist.all_gather over NCCL
"""
from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import AutoModelForSequenceClassification, AutoTokenizer

log = logging.getLogger("mnli")
NAME = "microsoft/deberta-v3-small"


def macro_f1(pred: torch.Tensor, gold: torch.Tensor, n_classes: int = 3) -> float:
    scores = []
    for c in range(n_classes):
        tp = ((pred == c) & (gold == c)).sum().item()
        fp = ((pred == c) & (gold != c)).sum().item()
        fn = ((pred != c) & (gold == c)).sum().item()
        scores.append(2 * tp / max(2 * tp + fp + fn, 1))
    return sum(scores) / n_classes


@torch.no_grad()
def gather_predictions(model: DDP, loader: DataLoader, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    model.eval()
    world = dist.get_world_size()
    preds, golds = [], []
    for batch in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        labels = batch.pop("labels")
        pairs = torch.stack([model(**batch).logits.argmax(-1), labels]).cpu()
        bucket = [torch.empty_like(pairs) for _ in range(world)]
        dist.all_gather(bucket, pairs)  # planted: PT028
        merged = torch.cat(bucket, dim=1)
        preds.append(merged[0])
        golds.append(merged[1])
    return torch.cat(preds), torch.cat(golds)


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO)

    tok = AutoTokenizer.from_pretrained(NAME)
    raw = load_dataset("nyu-mll/multi_nli")

    def collate(rows):
        enc = tok([r["premise"] for r in rows], [r["hypothesis"] for r in rows],
                  truncation=True, max_length=128, padding=True, return_tensors="pt")
        enc["labels"] = torch.tensor([r["label"] for r in rows])
        return enc

    train, dev = raw["train"], raw["validation_matched"]
    train_sampler = DistributedSampler(train)
    train_loader = DataLoader(train, batch_size=32, sampler=train_sampler, collate_fn=collate)
    dev_loader = DataLoader(dev, batch_size=64, sampler=DistributedSampler(dev, shuffle=False), collate_fn=collate)

    model = AutoModelForSequenceClassification.from_pretrained(NAME, num_labels=3).to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)

    for epoch in range(3):
        train_sampler.set_epoch(epoch)
        model.train()
        for batch in train_loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        preds, golds = gather_predictions(model, dev_loader, device)
        if dist.get_rank() == 0:
            log.info("epoch %d matched macro-F1 %.4f", epoch, macro_f1(preds, golds))
            model.module.save_pretrained(f"mnli-deberta/epoch-{epoch}")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
