"""Iteration-based GPT pretraining loop with print_rank_0 and a hand-rolled micro-step counter.

Planted: PT019 - micro-batch losses are accumulated via backward() without dividing by args.grad_accum
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as torchDDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def print_rank_0(message):
    if dist.get_rank() == 0:
        print(message, flush=True)


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=16)
    parser.add_argument("--train-iters", type=int, default=20000)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--save", default="checkpoints")
    parser.add_argument("--save-interval", type=int, default=1000)
    return parser.parse_args()


class GPT(nn.Module):
    def __init__(self, vocab=50304, hidden=768, layers=6, seq=512):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        layer = nn.TransformerEncoderLayer(hidden, 12, 4 * hidden, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        mask = nn.Transformer.generate_square_subsequent_mask(idx.size(1), device=idx.device)
        return self.lm_head(self.blocks(self.wte(idx) + self.wpe(pos), mask=mask, is_causal=True))


def main():
    args = get_args()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)

    data = torch.randint(0, 50304, (50000, 513))
    dataset = TensorDataset(data)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.micro_batch_size, sampler=sampler, pin_memory=True)

    model = torchDDP(GPT().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    epoch, micro_step, iteration = 0, 0, 0
    sampler.set_epoch(epoch)
    data_iterator = iter(loader)
    while True:
        try:
            (batch,) = next(data_iterator)
        except StopIteration:
            epoch += 1
            sampler.set_epoch(epoch)
            data_iterator = iter(loader)
            (batch,) = next(data_iterator)
        batch = batch.cuda(non_blocking=True)
        tokens, labels = batch[:, :-1], batch[:, 1:]
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(tokens)
        lm_loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.reshape(-1))
        lm_loss.backward()  # planted: PT019
        micro_step += 1
        if micro_step % args.grad_accum != 0:
            continue

        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iteration += 1
        if iteration % 10 == 0:
            print_rank_0(f" iteration {iteration:8d}/{args.train_iters} | lm loss: {lm_loss.item():.6E}")
        if iteration % args.save_interval == 0 and dist.get_rank() == 0:
            os.makedirs(args.save, exist_ok=True)
            torch.save({"iteration": iteration, "model": model.module.state_dict()},
                       os.path.join(args.save, f"iter_{iteration:07d}.pt"))
        if iteration >= args.train_iters:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
