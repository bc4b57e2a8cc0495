"""fp16 training where autocast, no_sync and the profiler are entered through contextlib.ExitStack."""
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

ACCUM = 4
PROFILE = os.environ.get("PROFILE", "0") == "1"


def build():
    return nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)

    model = DDP(build().to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    ds = TensorDataset(torch.randn(50_000, 3, 32, 32), torch.randint(0, 10, (50_000,)))
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=4, drop_last=True)

    with contextlib.ExitStack() as outer:
        prof = None
        if PROFILE:
            prof = outer.enter_context(profile(
                activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                schedule=schedule(wait=5, warmup=2, active=5, repeat=1),
                on_trace_ready=tensorboard_trace_handler(f"prof/rank{rank}")))
        for epoch in range(30):
            sampler.set_epoch(epoch)
            model.train()
            optimizer.zero_grad(set_to_none=True)
            seen = torch.zeros(2, device=device)
            for i, (x, y) in enumerate(loader):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                sync_now = (i + 1) % ACCUM == 0
                with contextlib.ExitStack() as stack:
                    if not sync_now:
                        stack.enter_context(model.no_sync())
                    with contextlib.ExitStack() as fwd:
                        fwd.enter_context(torch.amp.autocast("cuda", dtype=torch.float16))
                        loss = F.cross_entropy(model(x), y) / ACCUM
                    scaler.scale(loss).backward()
                seen += torch.stack([loss.detach() * ACCUM * y.size(0), torch.tensor(float(y.size(0)), device=device)])
                if sync_now:
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad(set_to_none=True)
                if prof is not None:
                    prof.step()
            dist.all_reduce(seen)
            if rank == 0:
                print(f"epoch {epoch}: loss {(seen[0] / seen[1]).item():.4f} scale {scaler.get_scale():.0f}")
                torch.save({"model": model.module.state_dict(), "scaler": scaler.state_dict()}, "exitstack_ckpt.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
