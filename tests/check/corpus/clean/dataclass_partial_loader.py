"""Config-driven shape: dataclass config, functools.partial(DataLoader, ...) and **loader_kwargs without shuffle, guard helper."""
import os
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


@dataclass(frozen=True)
class Config:
    epochs: int = 12
    batch_size: int = 96
    num_workers: int = 6
    lr: float = 2e-3
    ckpt_path: str = "checkpoints/last.pt"


def is_main_process():
    return dist.get_rank() == 0


def build_loaders(cfg: Config, train_set, val_set):
    loader_kwargs = {"batch_size": cfg.batch_size, "num_workers": cfg.num_workers,
                     "pin_memory": True, "drop_last": False}
    make_loader = partial(DataLoader, persistent_workers=cfg.num_workers > 0, **loader_kwargs)
    train_loader = make_loader(train_set, sampler=DistributedSampler(train_set, shuffle=True))
    val_loader = make_loader(val_set, sampler=DistributedSampler(val_set, shuffle=False))
    return train_loader, val_loader


def run_epoch(model, loader, device, optimizer=None):
    training = optimizer is not None
    model.train(training)
    acc = torch.zeros(2, device=device)
    with torch.set_grad_enabled(training):
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            out = model(batch["pixel_values"])
            loss = torch.nn.functional.cross_entropy(out, batch["labels"])
            if training:
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            acc += torch.stack([loss.detach() * batch["labels"].numel(),
                                torch.tensor(batch["labels"].numel(), device=device, dtype=loss.dtype)])
    dist.all_reduce(acc)
    return (acc[0] / acc[1]).item()


def main(cfg: Config, model, train_set, val_set):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)
    train_loader, val_loader = build_loaders(cfg, train_set, val_set)
    model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    for epoch in range(cfg.epochs):
        train_loader.sampler.set_epoch(epoch)
        train_loss = run_epoch(model, train_loader, device, optimizer)
        val_loss = run_epoch(model, val_loader, device)
        if is_main_process():
            print(f"epoch {epoch:02d} train {train_loss:.4f} val {val_loss:.4f}")
            os.makedirs(os.path.dirname(cfg.ckpt_path), exist_ok=True)
            torch.save({"epoch": epoch, "model": model.module.state_dict()}, cfg.ckpt_path)
    dist.destroy_process_group()
