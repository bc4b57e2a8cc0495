"""Token classification (NER) fine-tuning with DDP and per-epoch validation.

torchrun --nproc_per_node=4 run_ner_ddp.py
Planted: PT005 - the epoch loop calls set_epoch on the validation sampler, never on the shuffling train sampler
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger(__name__)
NUM_LABELS = 9


def synthetic_split(n, seq_len=128, vocab=28996):
    ids = torch.randint(0, vocab, (n, seq_len))
    labels = torch.randint(0, NUM_LABELS, (n, seq_len))
    return TensorDataset(ids, labels)


class Tagger(nn.Module):
    def __init__(self, vocab=28996, dim=256):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.enc = nn.LSTM(dim, dim // 2, num_layers=2, batch_first=True, bidirectional=True)
        self.classifier = nn.Linear(dim, NUM_LABELS)

    def forward(self, input_ids):
        h, _ = self.enc(self.emb(input_ids))
        return self.classifier(h)


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    stats = torch.zeros(2, device=device)
    for input_ids, labels in loader:
        input_ids, labels = input_ids.to(device), labels.to(device)
        pred = model(input_ids).argmax(-1)
        stats[0] += (pred == labels).sum()
        stats[1] += labels.numel()
    dist.all_reduce(stats)
    return (stats[0] / stats[1]).item()


def main(args):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    train_ds, val_ds = synthetic_split(20000), synthetic_split(2000)
    train_sampler = DistributedSampler(train_ds, seed=args.seed)
    val_sampler = DistributedSampler(val_ds, shuffle=False)
    train_loader = DataLoader(train_ds, batch_size=args.per_device_train_batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_ds, batch_size=64, sampler=val_sampler)

    model = DDP(Tagger().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.0, total_iters=args.num_train_epochs * len(train_loader))

    for epoch in range(args.num_train_epochs):  # planted: PT005
        val_sampler.set_epoch(epoch)
        model.train()
        for step, (input_ids, labels) in enumerate(train_loader):
            input_ids = input_ids.to(device)
            labels = labels.to(device)
            logits = model(input_ids)
            loss = F.cross_entropy(logits.view(-1, NUM_LABELS), labels.view(-1))
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        acc = evaluate(model, val_loader, device)
        if rank == 0:
            logger.info("epoch %d: token accuracy %.4f", epoch, acc)
            torch.save(model.module.state_dict(), os.path.join(args.output_dir, "pytorch_model.bin"))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--per_device_train_batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output_dir", default="ner-out")
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())
