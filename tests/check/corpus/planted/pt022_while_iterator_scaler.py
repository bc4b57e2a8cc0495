"""Step-based diffusion UNet training: a while loop pulls batches from a re-armed iterator.

Planted: PT022 - opt.zero_grad(set_to_none=True) runs before every micro-batch although scaler.step(opt) only runs every accum micro-batches
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from diffusion.data import LatentDataset
from diffusion.unet import UNet2D
from diffusion.schedule import NoiseSchedule

MAX_STEPS = 200_000
ACCUM = 4
LOG_EVERY = 100
SAVE_EVERY = 5_000


def setup():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return dist.get_rank(), local_rank


def main():
    rank, local_rank = setup()
    device = torch.device("cuda", local_rank)

    dataset = LatentDataset("/data/latents")
    sampler = DistributedSampler(dataset, drop_last=True)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=6, pin_memory=True)

    net = UNet2D(in_channels=4, base_channels=192).to(device)
    model = DDP(net, device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    scaler = torch.amp.GradScaler("cuda")
    schedule = NoiseSchedule(1000, device=device)

    epoch = 0
    sampler.set_epoch(epoch)
    data_iter = iter(loader)
    micro_step = 0
    global_step = 0
    log_buf = torch.zeros(2, device=device)
    while global_step < MAX_STEPS:
        try:
            latents = next(data_iter)
        except StopIteration:
            epoch += 1
            sampler.set_epoch(epoch)
            data_iter = iter(loader)
            latents = next(data_iter)
        latents = latents.to(device, non_blocking=True)

        opt.zero_grad(set_to_none=True)  # planted: PT022
        t = torch.randint(0, schedule.num_steps, (latents.size(0),), device=device)
        noise = torch.randn_like(latents)
        noisy = schedule.add_noise(latents, noise, t)
        with torch.autocast("cuda", dtype=torch.float16):
            pred = model(noisy, t)
            loss = F.mse_loss(pred.float(), noise)
        log_buf[0] += loss.detach()
        log_buf[1] += 1
        scaler.scale(loss / ACCUM).backward()
        micro_step += 1

        if micro_step % ACCUM == 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            global_step += 1

            if global_step % LOG_EVERY == 0:
                dist.all_reduce(log_buf)
                if rank == 0:
                    print(f"step {global_step} epoch {epoch} loss {(log_buf[0] / log_buf[1]).item():.5f}")
                log_buf.zero_()
            if global_step % SAVE_EVERY == 0 and rank == 0:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                            "scaler": scaler.state_dict(), "step": global_step},
                           f"unet_{global_step:07d}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
