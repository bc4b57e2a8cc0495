import contextlib
import logging
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logger = logging.getLogger("se")
N_FFT, HOP = 512, 128


class NoisySpeech(Dataset):
    def __len__(self):
        return 8000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        clean = torch.randn(32000, generator=g) * 0.1
        noisy = clean + torch.randn(32000, generator=g) * 0.05
        return noisy, clean


class MaskEstimator(nn.Module):
    def __init__(self, bins=N_FFT // 2 + 1, hidden=256):
        super().__init__()
        self.rnn = nn.LSTM(bins, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Sequential(nn.Linear(2 * hidden, bins), nn.Sigmoid())

    def forward(self, wav):
        window = torch.hann_window(N_FFT, device=wav.device)
        spec = torch.stft(wav, N_FFT, HOP, window=window, return_complex=True)
        mag = spec.abs().transpose(1, 2)
        mask = self.out(self.rnn(torch.log1p(mag))[0]).transpose(1, 2)
        return torch.istft(spec * mask, N_FFT, HOP, window=window, length=wav.size(-1))


def si_snr(est, ref, eps=1e-8):
    ref = ref - ref.mean(-1, keepdim=True)
    est = est - est.mean(-1, keepdim=True)
    proj = (est * ref).sum(-1, keepdim=True) * ref / (ref.pow(2).sum(-1, keepdim=True) + eps)
    noise = est - proj
    return 10 * torch.log10(proj.pow(2).sum(-1) / (noise.pow(2).sum(-1) + eps) + eps)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    is_root = dist.get_rank() == 0
    device = torch.device(f"cuda:{local_rank}")
    ckpt_path = os.environ.get("SE_CKPT", "se_last.pt")

    model = MaskEstimator().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=5e-4)
    start_epoch = 0
    with contextlib.suppress(FileNotFoundError):
        state = torch.load(ckpt_path, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start_epoch = state["epoch"] + 1
        if is_root:
            logger.info("resumed from %s at epoch %d", ckpt_path, start_epoch)
    ddp = DDP(model, device_ids=[local_rank])

    ds = NoisySpeech()
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=16, sampler=sampler, num_workers=4, pin_memory=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    epoch = start_epoch
    try:
        for epoch in range(start_epoch, 60):
            sampler.set_epoch(epoch)
            acc = torch.zeros(2, device=device)
            for noisy, clean in loader:
                noisy = noisy.to(device, non_blocking=True)
                clean = clean.to(device, non_blocking=True)
                score = si_snr(ddp(noisy), clean)
                loss = -score.mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(ddp.parameters(), 5.0)
                opt.step()
                acc += torch.stack([score.detach().sum(), torch.tensor(float(score.numel()), device=device)])
            dist.all_reduce(acc)
            if is_root:
                logger.info("epoch %d SI-SNR %.2f dB", epoch, (acc[0] / acc[1]).item())
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch},
                           ckpt_path)
    except KeyboardInterrupt:
        if is_root:
            logger.warning("interrupted during epoch %d", epoch)
    except Exception:
        logger.exception("rank %d failed", dist.get_rank())
        raise
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
