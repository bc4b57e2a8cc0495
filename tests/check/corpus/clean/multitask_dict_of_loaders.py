"""Multi-task learning with a shared encoder; one DistributedSampler-backed loader per task in a dict."""
import itertools
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logger = logging.getLogger("multitask")

TASKS = {"sentiment": 3, "topic": 20, "toxicity": 2}


class MultiTaskNet(nn.Module):
    def __init__(self, d_in=300, hidden=512):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.LayerNorm(hidden), nn.Linear(hidden, hidden))
        self.heads = nn.ModuleDict({name: nn.Linear(hidden, k) for name, k in TASKS.items()})

    def forward(self, x, task):
        return self.heads[task](self.encoder(x))


def make_datasets(n=20_000):
    g = torch.Generator().manual_seed(7)
    return {name: TensorDataset(torch.randn(n, 300, generator=g), torch.randint(0, k, (n,), generator=g))
            for name, k in TASKS.items()}


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    device = torch.device("cuda", local_rank)
    primary = dist.get_rank() == 0

    datasets = make_datasets()
    samplers = {name: DistributedSampler(ds, seed=i) for i, (name, ds) in enumerate(datasets.items())}
    loaders = {name: DataLoader(ds, batch_size=128, sampler=samplers[name], drop_last=True, num_workers=1)
               for name, ds in datasets.items()}
    weights = {"sentiment": 1.0, "topic": 0.5, "toxicity": 2.0}

    model = DDP(MultiTaskNet().to(device), device_ids=[local_rank], find_unused_parameters=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    steps_per_epoch = min(len(dl) for dl in loaders.values())

    for epoch in range(12):
        for sampler in samplers.values():
            sampler.set_epoch(epoch)
        model.train()
        iters = {name: iter(dl) for name, dl in loaders.items()}
        task_cycle = itertools.cycle(TASKS)
        stats = {name: torch.zeros(3, device=device) for name in TASKS}
        for _ in range(steps_per_epoch * len(TASKS)):
            task = next(task_cycle)
            x, y = next(iters[task])
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            logits = model(x, task)
            loss = weights[task] * F.cross_entropy(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            stats[task] += torch.stack([loss.detach() * y.numel(), (logits.argmax(-1) == y).sum().float(),
                                        torch.tensor(float(y.numel()), device=device)])
        for name in TASKS:
            dist.all_reduce(stats[name])
        if primary:
            summary = ", ".join(f"{n}: loss {(s[0] / s[2]).item():.3f} acc {(s[1] / s[2]).item():.3f}" for n, s in stats.items())
            logger.info("epoch %d | %s", epoch, summary)
            torch.save({"encoder": model.module.encoder.state_dict(),
                        "heads": {n: h.state_dict() for n, h in model.module.heads.items()}}, "multitask.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
