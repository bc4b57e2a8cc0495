"""DDP training driven from an asyncio event loop: a heartbeat task and non-blocking metric export."""
import asyncio
import json
import logging
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("async_train")
RUN_DIR = Path(os.environ.get("RUN_DIR", "runs/async"))


def _append_jsonl(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


async def export_metrics(record: dict) -> None:
    await asyncio.to_thread(_append_jsonl, RUN_DIR / "metrics.jsonl", record)


async def heartbeat(rank: int, interval: float, stop: asyncio.Event) -> None:
    beat_file = RUN_DIR / f"heartbeat_rank{rank}.txt"
    while not stop.is_set():
        beat_file.write_text(str(time.time()))
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval)
        except asyncio.TimeoutError:
            pass


async def train_epoch(model, loader, optimizer, device, epoch) -> torch.Tensor:
    loader.sampler.set_epoch(epoch)
    model.train()
    stats = torch.zeros(2, device=device)
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        stats += torch.stack([loss.detach() * y.numel(), torch.tensor(float(y.numel()), device=device)])
        if step % 20 == 0:
            await asyncio.sleep(0)
    dist.all_reduce(stats)
    return stats[0] / stats[1]


async def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)
    RUN_DIR.mkdir(parents=True, exist_ok=True)

    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.GELU(), nn.Linear(512, 10)).to(device),
                device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ds = TensorDataset(torch.randn(60_000, 1, 28, 28), torch.randint(0, 10, (60_000,)))
    loader = DataLoader(ds, batch_size=256, sampler=DistributedSampler(ds), num_workers=2)

    stop = asyncio.Event()
    beat = asyncio.create_task(heartbeat(rank, 30.0, stop))
    pending: list[asyncio.Task] = []
    try:
        for epoch in range(10):
            mean_loss = (await train_epoch(model, loader, optimizer, device, epoch)).item()
            if rank == 0:
                logger.info("epoch %d mean loss %.4f", epoch, mean_loss)
                pending.append(asyncio.create_task(export_metrics({"epoch": epoch, "loss": mean_loss})))
                await asyncio.to_thread(torch.save, model.module.state_dict(), RUN_DIR / "model.pt")
    finally:
        stop.set()
        await beat
        await asyncio.gather(*pending)
        dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())
