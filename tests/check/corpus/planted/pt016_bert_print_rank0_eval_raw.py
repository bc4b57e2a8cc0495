"""Masked-LM pretraining in Megatron's BERT layout; uses print_rank_0 for its logging.

torchrun --nproc_per_node=8 pretrain_bert.py --train-iters 200000
Planted: PT016 - evaluate_and_print_results() uses a plain print, run by every rank
"""
import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as LocalDDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

MASK_ID, VOCAB = 103, 30522


def print_rank_0(message):
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(message, flush=True)


class MLMDataset(Dataset):
    def __init__(self, n, seq_len=128):
        self.n, self.seq_len = n, seq_len

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        tokens = torch.randint(1000, VOCAB, (self.seq_len,))
        mask = torch.rand(self.seq_len) < 0.15
        labels = torch.where(mask, tokens, torch.full_like(tokens, -100))
        return torch.where(mask, torch.full_like(tokens, MASK_ID), tokens), labels


class BertLM(nn.Module):
    def __init__(self, hidden=256, layers=4):
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, hidden)
        self.position_embeddings = nn.Embedding(512, hidden)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(hidden, 4, 4 * hidden, batch_first=True), layers)
        self.lm_head = nn.Linear(hidden, VOCAB)

    def forward(self, tokens):
        pos = torch.arange(tokens.size(1), device=tokens.device)
        return self.lm_head(self.encoder(self.word_embeddings(tokens) + self.position_embeddings(pos)))


def forward_step(model, batch, device):
    tokens, labels = (t.to(device, non_blocking=True) for t in batch)
    logits = model(tokens)
    return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=-100)


@torch.no_grad()
def evaluate_and_print_results(prefix, model, loader, device, iteration):
    model.eval()
    total = torch.zeros((), device=device)
    n = 0
    for batch in loader:
        total += forward_step(model, batch, device)
        n += 1
    total /= max(n, 1)
    dist.all_reduce(total, op=dist.ReduceOp.AVG)
    print(f"validation loss at {prefix} | iteration {iteration} | lm loss {total.item():.6E} | ppl {math.exp(min(20, total.item())):.6E}")  # planted: PT016
    model.train()


def main(args):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_ds, valid_ds = MLMDataset(2_000_000), MLMDataset(20_000)
    train_sampler = DistributedSampler(train_ds)
    valid_sampler = DistributedSampler(valid_ds, shuffle=False)
    train_loader = DataLoader(train_ds, batch_size=args.micro_batch_size, sampler=train_sampler, num_workers=4)
    valid_loader = DataLoader(valid_ds, batch_size=args.micro_batch_size, sampler=valid_sampler, num_workers=2)

    model = LocalDDP(BertLM().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    print_rank_0(f"> number of parameters: {sum(p.numel() for p in model.parameters())}")

    iteration, epoch = 0, 0
    while iteration < args.train_iters:
        train_sampler.set_epoch(epoch)
        for batch in train_loader:
            loss = forward_step(model, batch, device)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            iteration += 1
            if iteration % args.log_interval == 0:
                print_rank_0(f" iteration {iteration:8d} | lm loss (rank 0 micro-batch) {loss.item():.6E}")
            if iteration % args.eval_interval == 0:
                evaluate_and_print_results(f"iteration {iteration}", model, valid_loader, device, iteration)
            if iteration >= args.train_iters:
                break
        epoch += 1
    if dist.get_rank() == 0:
        torch.save({"model": model.module.state_dict(), "iteration": iteration}, os.path.join(args.save, "bert_final.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-iters", type=int, default=200000)
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--log-interval", type=int, default=100)
    parser.add_argument("--eval-interval", type=int, default=1000)
    parser.add_argument("--save", default=".")
    main(parser.parse_args())
