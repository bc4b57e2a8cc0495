"""Per-rank log files, per-rank TensorBoard dirs and per-rank RNG snapshots for bit-exact resumption."""
import logging
import os
import random

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter

OUT = os.environ.get("OUT_DIR", "run_perrank")


def setup_logging(rank):
    os.makedirs(f"{OUT}/logs", exist_ok=True)
    logger = logging.getLogger("train")
    logger.setLevel(logging.DEBUG)
    fh = logging.FileHandler(f"{OUT}/logs/train_rank{rank:02d}.log")
    fh.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s"))
    logger.addHandler(fh)
    return logger


def rng_path(rank):
    return os.path.join(OUT, "rng", f"rng_state_rank{rank}.pth")


def save_rng(rank):
    os.makedirs(os.path.join(OUT, "rng"), exist_ok=True)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state()}, rng_path(rank))


def load_rng(rank):
    state = torch.load(rng_path(rank), map_location="cpu", weights_only=False)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["cpu"])
    torch.cuda.set_rng_state(state["cuda"])


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)
    log = setup_logging(rank)
    writer = SummaryWriter(log_dir=f"{OUT}/tb/rank_{rank}")

    torch.manual_seed(1234 + rank)
    model = DDP(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 4)).to(device),
                device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ds = TensorDataset(torch.randn(40_000, 32), torch.randint(0, 4, (40_000,)))
    sampler = DistributedSampler(ds, seed=0)
    loader = DataLoader(ds, batch_size=100, sampler=sampler)

    start_epoch = 0
    if os.path.exists(rng_path(rank)) and os.path.exists(f"{OUT}/model.pt"):
        ckpt = torch.load(f"{OUT}/model.pt", map_location=device, weights_only=True)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start_epoch = int(ckpt["epoch"]) + 1
        load_rng(rank)
        log.info("resumed from epoch %d", start_epoch)

    step = start_epoch * len(loader)
    for epoch in range(start_epoch, 15):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            writer.add_scalar("loss/local_batch", loss.item(), step)
            step += 1
        log.info("epoch %d done, last local loss %.4f", epoch, loss.item())
        save_rng(rank)
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, f"{OUT}/model.pt")
        dist.barrier()
    writer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
