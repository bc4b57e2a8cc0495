"""Continued pretraining of a GPT-2 sized model from an init checkpoint, DDP + bf16, token-file batches.

Planted: PT009 - model.load_state_dict(torch.load(args.init_from, weights_only=True)) with no map_location.
"""
import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from model import GPT, GPTConfig


class TokenBlocks(Dataset):
    def __init__(self, path, block_size):
        self.data = np.memmap(path, dtype=np.uint16, mode="r")
        self.block_size = block_size

    def __len__(self):
        return (len(self.data) - 1) // self.block_size

    def __getitem__(self, i):
        chunk = torch.from_numpy(self.data[i * self.block_size:(i + 1) * self.block_size + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init_from", default="out/gpt2_base.pt")
    parser.add_argument("--data", default="data/code/train.bin")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default="out/gpt2_code.pt")
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    master_process = int(os.environ["RANK"]) == 0
    torch.cuda.set_device(ddp_local_rank)
    device = f"cuda:{ddp_local_rank}"

    model = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024))
    model.load_state_dict(torch.load(args.init_from, weights_only=True))  # planted: PT009
    model = model.to(device)
    model = DDP(model, device_ids=[ddp_local_rank])
    raw_model = model.module
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)

    dataset = TokenBlocks(args.data, 1024)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, pin_memory=True)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for it, (x, y) in enumerate(loader):
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                _, loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if it % 500 == 0:
                lossf = loss.detach().clone()
                dist.all_reduce(lossf, op=dist.ReduceOp.AVG)
                if master_process:
                    print(f"epoch {epoch} iter {it}: loss {lossf.item():.4f}")
        if master_process:
            torch.save({"model": raw_model.state_dict(), "epoch": epoch}, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
