"""WaveNet-style vocoder (mel-conditioned, mu-law targets) trained with accumulation; each batch in try/finally.

Planted: PT027 - the per-batch `finally:` block advances the LR scheduler on every micro-batch, optimizer steps every ACCUM
"""
from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

log = logging.getLogger("wavenet")
ACCUM = 2
MU = 256


class ResidualLayer(nn.Module):
    def __init__(self, ch: int, cond: int, dilation: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(ch, 2 * ch, 2, dilation=dilation, padding=dilation)
        self.cond = nn.Conv1d(cond, 2 * ch, 1)
        self.res = nn.Conv1d(ch, ch, 1)
        self.skip = nn.Conv1d(ch, ch, 1)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.conv(x)[..., : x.size(-1)] + self.cond(c)
        a, b = h.chunk(2, dim=1)
        z = torch.tanh(a) * torch.sigmoid(b)
        return x + self.res(z), self.skip(z)


class WaveNet(nn.Module):
    def __init__(self, ch: int = 64, cond: int = 80, layers: int = 20) -> None:
        super().__init__()
        self.inp = nn.Embedding(MU, ch)
        self.upsample = nn.ConvTranspose1d(cond, cond, 512, stride=256, padding=128)
        self.layers = nn.ModuleList(ResidualLayer(ch, cond, 2 ** (i % 10)) for i in range(layers))
        self.out = nn.Sequential(nn.ReLU(), nn.Conv1d(ch, ch, 1), nn.ReLU(), nn.Conv1d(ch, MU, 1))

    def forward(self, audio_q: torch.Tensor, mel: torch.Tensor) -> torch.Tensor:
        x = self.inp(audio_q).transpose(1, 2)
        c = self.upsample(mel)[..., : x.size(-1)]
        skips = 0
        for layer in self.layers:
            x, s = layer(x, c)
            skips = skips + s
        return self.out(skips)


def main() -> None:
    from ljspeech_pairs import MelAudioClips

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO if dist.get_rank() == 0 else logging.WARNING)

    dataset = MelAudioClips("LJSpeech-1.1", clip_samples=8192, mu=MU)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=4, pin_memory=True)

    model = DDP(WaveNet().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=200_000, gamma=0.5)

    for epoch in range(1000):
        sampler.set_epoch(epoch)
        model.train()
        for i, (audio_q, mel) in enumerate(loader):
            try:
                audio_q = audio_q.to(device, non_blocking=True)
                mel = mel.to(device, non_blocking=True)
                logits = model(audio_q[:, :-1], mel)
                loss = F.cross_entropy(logits, audio_q[:, 1:]) / ACCUM
                loss.backward()
                if (i + 1) % ACCUM == 0:
                    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            finally:
                scheduler.step()  # planted: PT027
        log.info("epoch %d lr %.2e", epoch, scheduler.get_last_lr()[0])
        if dist.get_rank() == 0 and epoch % 50 == 0:
            torch.save(model.module.state_dict(), f"wavenet_{epoch}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
