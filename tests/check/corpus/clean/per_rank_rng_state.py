"""HF-Trainer-style checkpointing shape: every rank writes its own RNG-state file named by rank; rank 0 writes the model."""
import os
import random

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def save_rng_state(output_dir, rank):
    rng_states = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
        "cuda": torch.cuda.random.get_rng_state(),
    }
    torch.save(rng_states, os.path.join(output_dir, f"rng_state_{rank}.pth"))


def load_rng_state(output_dir, rank):
    path = os.path.join(output_dir, f"rng_state_{rank}.pth")
    if not os.path.isfile(path):
        return
    states = torch.load(path, map_location="cpu", weights_only=False)
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    torch.cuda.random.set_rng_state(states["cuda"])


def save_checkpoint(model, optimizer, step, output_dir):
    rank = dist.get_rank()
    if rank == 0:
        os.makedirs(output_dir, exist_ok=True)
    dist.barrier()
    save_rng_state(output_dir, rank)
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                   os.path.join(output_dir, "trainer_state.pt"))
    dist.barrier()


def train(model_fn, loader, steps=1000, save_steps=250, output_dir="ckpt"):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    load_rng_state(output_dir, rank)
    device = torch.device("cuda", local_rank)
    model = DDP(model_fn().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step, epoch = 0, 0
    while step < steps:
        loader.sampler.set_epoch(epoch)
        for inputs, labels in loader:
            inputs, labels = inputs.to(device), labels.to(device)
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step % save_steps == 0:
                save_checkpoint(model, optimizer, step, os.path.join(output_dir, f"checkpoint-{step}"))
            if step >= steps:
                break
        epoch += 1
    dist.destroy_process_group()
