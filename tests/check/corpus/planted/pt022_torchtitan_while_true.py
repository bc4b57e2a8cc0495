"""Step-based LM training loop (while True with a manual step counter) over an infinite data iterator.

Planted: PT022 - optimizer.zero_grad(set_to_none=True) at the top of every micro-batch while the optimizer steps every grad_accum micro-batches
"""
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class JobConfig:
    steps: int = 10000
    warmup_steps: int = 200
    grad_accum: int = 4
    lr: float = 8e-4
    batch_size: int = 8
    seq_len: int = 256
    vocab: int = 32000
    log_freq: int = 10
    ckpt_interval: int = 500


def build_model(cfg):
    layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, norm_first=True)
    return nn.Sequential(nn.Embedding(cfg.vocab, 512), nn.TransformerEncoder(layer, 6), nn.Linear(512, cfg.vocab))


def infinite_batches(loader, sampler):
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        for (batch,) in loader:
            yield batch
        epoch += 1


def main():
    cfg = JobConfig()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}")
    is_rank0 = dist.get_rank() == 0

    data = torch.randint(0, cfg.vocab, (40000, cfg.seq_len + 1))
    ds = TensorDataset(data)
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=cfg.batch_size, sampler=sampler, drop_last=True)
    data_iterator = infinite_batches(loader, sampler)

    model = DDP(build_model(cfg).to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / cfg.warmup_steps))

    step, micro_step = 0, 0
    while True:
        optimizer.zero_grad(set_to_none=True)  # planted: PT022
        batch = next(data_iterator).to(device, non_blocking=True)
        inputs, labels = batch[:, :-1], batch[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pred = model(inputs)
        loss = F.cross_entropy(pred.float().flatten(0, 1), labels.flatten()) / cfg.grad_accum
        loss.backward()
        micro_step += 1
        if micro_step % cfg.grad_accum:
            continue

        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        lr_scheduler.step()
        step += 1
        if is_rank0 and step % cfg.log_freq == 0:
            print(f"step: {step:6d}  loss: {loss.item() * cfg.grad_accum:7.4f}  lr: {lr_scheduler.get_last_lr()[0]:.2e}")
        if is_rank0 and step % cfg.ckpt_interval == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                       f"outputs/checkpoint/step-{step}.pt")
        if step >= cfg.steps:
            break

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
