"""Iteration-based DDP training of a small GPT-style model, steps counted by hand in a while loop.

Planted: PT019 - every micro-batch backpropagates the full loss; the optimizer steps when micro_steps % accum == 0
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from tiny_gpt import TinyGPT, TokenBlocks


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="tokens.bin")
    parser.add_argument("--max-updates", type=int, default=50_000)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--accum", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--save-every", type=int, default=2_000)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    master = dist.get_rank() == 0
    device = torch.device("cuda", local_rank)

    dataset = TokenBlocks(args.data, block_size=512)
    sampler = DistributedSampler(dataset, seed=42)
    loader = DataLoader(dataset, batch_size=args.micro_batch, sampler=sampler, num_workers=2, pin_memory=True)

    model = DDP(TinyGPT(vocab_size=50257).to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    epoch = 0
    micro_steps = 0
    updates = 0
    sampler.set_epoch(epoch)
    it = iter(loader)
    model.train()
    while updates < args.max_updates:
        try:
            x, y = next(it)
        except StopIteration:
            epoch += 1
            sampler.set_epoch(epoch)
            it = iter(loader)
            continue
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()  # planted: PT019
        micro_steps += 1
        if micro_steps % args.accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            updates += 1
            if master and updates % 100 == 0:
                print(f"update {updates} epoch {epoch} loss {loss.item():.4f}")
            if master and updates % args.save_every == 0:
                torch.save({"model": model.module.state_dict(), "updates": updates}, "tiny_gpt.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
