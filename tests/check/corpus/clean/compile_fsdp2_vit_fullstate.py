"""ViT pre-training with torch.compile and FSDP2 (fully_shard); full state dict gathered for export."""
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler as DistSampler
from torchvision.models import vit_b_16

GRAD_ACC = 4
EPOCHS = 20


def shard(model: nn.Module) -> nn.Module:
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.encoder.layers:
        fully_shard(block, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mp_policy=policy)
    return model


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device(f"cuda:{local_rank}"))
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)

    torch.manual_seed(0)
    model = vit_b_16(num_classes=1000).to(device)
    model = shard(model)
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=500)

    ds = TensorDataset(torch.randn(8192, 3, 224, 224), torch.randint(0, 1000, (8192,)))
    sampler = DistSampler(ds, shuffle=True, drop_last=True)
    loader = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=6, pin_memory=True)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        t0 = time.perf_counter()
        loss_acc = torch.zeros(2, device=device)
        for it, (img, lbl) in enumerate(loader):
            img, lbl = img.to(device, non_blocking=True), lbl.to(device, non_blocking=True)
            boundary = (it + 1) % GRAD_ACC == 0
            model.set_requires_gradient_sync(boundary)
            loss = F.cross_entropy(compiled(img), lbl, label_smoothing=0.1)
            loss_acc += torch.stack([loss.detach(), torch.ones((), device=device)])
            loss = loss / GRAD_ACC
            loss.backward()
            if boundary:
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                warmup.step()
                opt.zero_grad(set_to_none=True)
        dist.all_reduce(loss_acc)
        if rank == 0:
            dt = time.perf_counter() - t0
            print(f"epoch {epoch}: mean loss {(loss_acc[0] / loss_acc[1]).item():.4f}, {len(ds) / dt:.0f} img/s")

        full_sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            torch.save(full_sd, f"vit_epoch{epoch:03d}.pt")
        del full_sd
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
