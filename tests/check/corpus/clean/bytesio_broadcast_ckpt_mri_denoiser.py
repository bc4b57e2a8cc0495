import io
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

CKPT = Path(os.environ.get("CKPT", "mri_dncnn.pt"))


class Slices(Dataset):
    def __len__(self):
        return 12_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        clean = torch.rand(1, 160, 160, generator=g)
        sigma = 0.02 + 0.08 * torch.rand(1, generator=g)
        return clean + sigma * torch.randn(clean.shape, generator=g), clean


class DnCNN(nn.Module):
    def __init__(self, depth=17, ch=64):
        super().__init__()
        layers = [nn.Conv2d(1, ch, 3, padding=1), nn.ReLU(inplace=True)]
        for _ in range(depth - 2):
            layers += [nn.Conv2d(ch, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch), nn.ReLU(inplace=True)]
        layers.append(nn.Conv2d(ch, 1, 3, padding=1))
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return x - self.body(x)


def write_atomically(state: dict, path: Path) -> None:
    """Serialize in memory on the leader, then replace the file in one step."""
    buf = io.BytesIO()
    torch.save(state, buf)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as fh:
        fh.write(buf.getbuffer())
    os.replace(tmp, path)


def load_from_leader(device: torch.device) -> dict | None:
    """Rank 0 reads the file once; every rank deserializes the same bytes."""
    payload = [None]
    if dist.get_rank() == 0 and CKPT.exists():
        payload[0] = CKPT.read_bytes()
    dist.broadcast_object_list(payload, src=0)
    if payload[0] is None:
        return None
    return torch.load(io.BytesIO(payload[0]), map_location=device, weights_only=True)


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    net = nn.SyncBatchNorm.convert_sync_batchnorm(DnCNN()).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    start = 0
    if (state := load_from_leader(device)) is not None:
        net.load_state_dict(state["net"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"] + 1
    model = DDP(net, device_ids=[local_rank])

    ds = Slices()
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=4, pin_memory=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50, last_epoch=start - 1)

    for epoch in range(start, 50):
        sampler.set_epoch(epoch)
        model.train()
        mse_sum = torch.zeros((), device=device)
        n = torch.zeros((), device=device)
        for noisy, clean in loader:
            noisy, clean = noisy.to(device), clean.to(device)
            out = model(noisy)
            loss = F.mse_loss(out, clean)
            opt.zero_grad()
            loss.backward()
            opt.step()
            mse_sum += F.mse_loss(out.detach(), clean, reduction="sum")
            n += clean.numel()
        sched.step()
        dist.all_reduce(mse_sum)
        dist.all_reduce(n)
        psnr = -10 * torch.log10(mse_sum / n)
        if dist.get_rank() == 0:
            print(f"epoch {epoch} train PSNR {psnr.item():.2f} dB")
            write_atomically({"net": net.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, CKPT)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
