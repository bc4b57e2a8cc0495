"""Word-level text classification (EmbeddingBag) with DDP; --no-cuda forces a CPU run.

Planted: PT017 - setup_distributed() passes the module constant DIST_BACKEND = "nccl" even when use_cuda is False
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from textdata import AGNewsDataset, collate_batch

DIST_BACKEND = "nccl"


class TextClassificationModel(nn.Module):
    def __init__(self, vocab_size, embed_dim, num_class):
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embed_dim, sparse=False)
        self.fc = nn.Linear(embed_dim, num_class)

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets))


def setup_distributed(args):
    args.local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group(backend=DIST_BACKEND, init_method="env://")  # planted: PT017
    args.rank = dist.get_rank()
    args.world_size = dist.get_world_size()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5.0)
    parser.add_argument("--no-cuda", action="store_true")
    args = parser.parse_args()

    use_cuda = not args.no_cuda and torch.cuda.is_available()
    setup_distributed(args)
    if use_cuda:
        torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank)
    else:
        device = torch.device("cpu")

    train_iter = AGNewsDataset(split="train")
    sampler = DistributedSampler(train_iter, num_replicas=args.world_size, rank=args.rank)
    loader = DataLoader(train_iter, batch_size=args.batch_size, sampler=sampler,
                        collate_fn=collate_batch, pin_memory=use_cuda)

    model = TextClassificationModel(train_iter.vocab_size, 64, 4).to(device)
    model = DDP(model, device_ids=[args.local_rank] if use_cuda else None)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.1)

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        for idx, (label, text, offsets) in enumerate(loader):
            label, text, offsets = label.to(device), text.to(device), offsets.to(device)
            optimizer.zero_grad()
            loss = criterion(model(text, offsets), label)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            optimizer.step()
            if idx % 500 == 0 and args.rank == 0:
                print(f"| epoch {epoch:3d} | {idx:5d}/{len(loader):5d} batches | loss {loss.item():.4f}")
        scheduler.step()

    if args.rank == 0:
        torch.save(model.module.state_dict(), "text_classifier.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
