"""Checkpoint/resume with torch.distributed.checkpoint and a Stateful AppState wrapper (DDP model)."""
import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class AppState(Stateful):
    def __init__(self, model, optimizer, scheduler, epoch=0):
        self.model, self.optimizer, self.scheduler, self.epoch = model, optimizer, scheduler, epoch

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd, "sched": self.scheduler.state_dict(), "epoch": self.epoch}

    def load_state_dict(self, state_dict):
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])
        self.scheduler.load_state_dict(state_dict["sched"])
        self.epoch = state_dict["epoch"]


def latest_checkpoint(root: Path):
    marker = root / "LATEST"
    return root / marker.read_text().strip() if marker.exists() else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-root", type=Path, default=Path("dcp_ckpts"))
    ap.add_argument("--epochs", type=int, default=40)
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)

    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.SiLU(), nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, 1)).to(device),
                device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    app = AppState(model, optimizer, scheduler)

    resume_from = latest_checkpoint(args.ckpt_root)
    if resume_from is not None:
        state = {"app": app}
        dcp.load(state, checkpoint_id=str(resume_from))
        app.epoch += 1

    x = torch.randn(100_000, 64)
    ds = TensorDataset(x, (x[:, :8] ** 2).sum(1, keepdim=True))
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=512, sampler=sampler)

    for epoch in range(app.epoch, args.epochs):
        app.epoch = epoch
        sampler.set_epoch(epoch)
        sse = torch.zeros(2, device=device)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            sse += torch.stack([loss.detach() * xb.size(0), torch.tensor(float(xb.size(0)), device=device)])
        scheduler.step()
        dist.all_reduce(sse)

        ckpt_dir = args.ckpt_root / f"epoch_{epoch:04d}"
        dcp.save({"app": app}, checkpoint_id=str(ckpt_dir))
        dist.barrier()
        if rank == 0:
            (args.ckpt_root / "LATEST").write_text(ckpt_dir.name)
            print(f"epoch {epoch} mse {(sse[0] / sse[1]).item():.5f} lr {scheduler.get_last_lr()[0]:.1e} -> {ckpt_dir}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
