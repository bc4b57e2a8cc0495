"""Token-classification (NER-like) training that stops once every validation metric meets its threshold.

Planted: PT025 - `if all(metrics[k] >= thresholds[k] ...): break` uses each rank's own evaluation dict, never reduced or broadcast
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

NUM_TAGS, IGNORE = 9, -100


class Tagger(nn.Module):
    def __init__(self, vocab=20000, dim=200):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.enc = nn.LSTM(dim, dim // 2, num_layers=2, bidirectional=True, batch_first=True)
        self.out = nn.Linear(dim, NUM_TAGS)

    def forward(self, ids):
        h, _ = self.enc(self.emb(ids))
        return self.out(h)


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    tp = fp = fn = correct = total = 0
    for ids, tags in loader:
        ids, tags = ids.to(device), tags.to(device)
        pred = model(ids).argmax(-1)
        mask = tags != IGNORE
        correct += ((pred == tags) & mask).sum().item()
        total += mask.sum().item()
        entity_pred, entity_gold = (pred > 0) & mask, (tags > 0) & mask
        tp += (entity_pred & entity_gold & (pred == tags)).sum().item()
        fp += (entity_pred & (pred != tags)).sum().item()
        fn += (entity_gold & (pred != tags)).sum().item()
    precision, recall = tp / max(tp + fp, 1), tp / max(tp + fn, 1)
    return {"accuracy": correct / max(total, 1), "f1": 2 * precision * recall / max(precision + recall, 1e-9)}


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    ids = torch.randint(0, 20000, (14000, 48))
    tags = torch.randint(0, NUM_TAGS, (14000, 48))
    train_ds, val_ds = TensorDataset(ids[:12000], tags[:12000]), TensorDataset(ids[12000:], tags[12000:])
    train_sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=32, sampler=train_sampler)
    eval_loader = DataLoader(val_ds, batch_size=128, sampler=DistributedSampler(val_ds, shuffle=False))

    model = DDP(Tagger().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    thresholds = {"accuracy": 0.97, "f1": 0.90}

    for epoch in range(60):
        train_sampler.set_epoch(epoch)
        model.train()
        for batch_ids, batch_tags in train_loader:
            batch_ids, batch_tags = batch_ids.to(device), batch_tags.to(device)
            logits = model(batch_ids)
            loss = F.cross_entropy(logits.reshape(-1, NUM_TAGS), batch_tags.reshape(-1), ignore_index=IGNORE)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        metrics = evaluate(model, eval_loader, device)
        if all(metrics[k] >= thresholds[k] for k in thresholds):  # planted: PT025
            break

    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "tagger_final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
