"""Denoising-diffusion training that splits each batch into micro-batches to fit in memory.

torchrun --nproc_per_node=8 train_diffusion.py --batch 256 --microbatch 32

Each micro-batch's mean loss is weighed by its share of the batch, so the step carries the mean
gradient of the whole batch whatever the micro-batch size.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def forward_backward(model, opt, batch, noise_level, microbatch):
    opt.zero_grad(set_to_none=True)
    for i in range(0, batch.shape[0], microbatch):
        micro = batch[i : i + microbatch]
        t = noise_level[i : i + microbatch]
        noisy = micro + t[:, None] * torch.randn_like(micro)
        last = i + microbatch >= batch.shape[0]
        if last:
            loss = (model(noisy) - micro).pow(2).mean()
        else:
            with model.no_sync():
                loss = (model(noisy) - micro).pow(2).mean()
        (loss * micro.shape[0] / batch.shape[0]).backward()
    opt.step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--microbatch", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.SiLU(), nn.Linear(256, 64)).cuda(),
                device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(1000):
        batch = torch.randn(args.batch, 64, device="cuda")
        noise_level = torch.rand(args.batch, device="cuda")
        forward_backward(model, opt, batch, noise_level, args.microbatch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
