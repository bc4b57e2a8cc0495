import os
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class FakeImages(Dataset):
    def __len__(self):
        return 64_000

    def __getitem__(self, i):
        return torch.randn(3, 224, 224), i % 1000


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    dev = torch.device(f"cuda:{local_rank}")
    report = dist.get_rank() == 0

    ds = FakeImages()
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=8, pin_memory=True, drop_last=True)
    model = torchvision.models.resnet50().to(dev, memory_format=torch.channels_last)
    model = DDP(model, device_ids=[local_rank], bucket_cap_mb=50)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    start_evt = torch.cuda.Event(enable_timing=True)
    end_evt = torch.cuda.Event(enable_timing=True)
    fwd_done = torch.cuda.Event(enable_timing=True)

    for epoch in range(3):
        sampler.set_epoch(epoch)
        step_ms, fwd_ms = [], []
        for i, (x, y) in enumerate(loader):
            x = x.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
            y = y.to(dev, non_blocking=True)
            start_evt.record()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            fwd_done.record()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            end_evt.record()
            end_evt.synchronize()
            if i >= 10:
                step_ms.append(start_evt.elapsed_time(end_evt))
                fwd_ms.append(start_evt.elapsed_time(fwd_done))

        med_step = statistics.median(step_ms)
        local = torch.tensor([64 * 1000.0 / med_step, med_step, statistics.median(fwd_ms)], device=dev)
        imgs_per_s = local[:1].clone()
        dist.all_reduce(imgs_per_s, op=dist.ReduceOp.SUM)
        slowest = local[1:].clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        mean_loss = loss.detach().float()
        dist.all_reduce(mean_loss)
        mean_loss /= world
        if report:
            print(f"epoch {epoch}: aggregate {imgs_per_s.item():,.0f} img/s over {world} GPUs, "
                  f"slowest rank step {slowest[0].item():.1f} ms (fwd {slowest[1].item():.1f} ms), "
                  f"last loss {mean_loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
