"""Fine-tune a wav2vec-style CTC speech encoder; per-step callbacks kept in a list.

Planted: PT016 - the log_progress callback prints, and every rank runs every callback
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from torchaudio.datasets import LIBRISPEECH

Callback = Callable[[int, float], None]
CHARS = " 'abcdefghijklmnopqrstuvwxyz"


class ConvFeatureEncoder(nn.Module):
    def __init__(self, dim: int = 512) -> None:
        super().__init__()
        specs = [(10, 5), (3, 2), (3, 2), (3, 2), (2, 2)]
        layers: list[nn.Module] = []
        cin = 1
        for k, s in specs:
            layers += [nn.Conv1d(cin, dim, k, s), nn.GELU()]
            cin = dim
        self.conv = nn.Sequential(*layers)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, 8, 2048, batch_first=True), 6)
        self.ctc_head = nn.Linear(dim, len(CHARS) + 1)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        feats = self.conv(wav.unsqueeze(1)).transpose(1, 2)
        return self.ctc_head(self.encoder(feats)).log_softmax(-1)


def collate(batch):
    wavs = [b[0].squeeze(0)[:160000] for b in batch]
    texts = [b[2].lower() for b in batch]
    wav = nn.utils.rnn.pad_sequence(wavs, batch_first=True)
    targets = [torch.tensor([CHARS.index(c) + 1 for c in t if c in CHARS]) for t in texts]
    return wav, torch.cat(targets), torch.tensor([len(t) for t in targets])


def log_progress(step: int, loss: float) -> None:
    if step % 100 == 0:
        print(f"step {step:>7d} | ctc loss {loss:.4f}", flush=True)  # planted: PT016


def make_checkpointer(model: DistributedDataParallel, out: Path) -> Callback:
    def maybe_checkpoint(step: int, loss: float) -> None:
        if dist.get_rank() == 0 and step > 0 and step % 5000 == 0:
            torch.save(model.module.state_dict(), out / f"step_{step}.pt")
    return maybe_checkpoint


def main() -> None:
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    out = Path("checkpoints/w2v_ctc")
    out.mkdir(parents=True, exist_ok=True)

    dataset = LIBRISPEECH("./data", url="train-clean-100", download=False)
    sampler = DistributedSampler(dataset, seed=17)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, collate_fn=collate, num_workers=6)

    model = DistributedDataParallel(ConvFeatureEncoder().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    callbacks: list[Callback] = [log_progress, make_checkpointer(model, out)]

    step = 0
    for epoch in range(30):
        sampler.set_epoch(epoch)
        for wav, targets, target_lengths in loader:
            wav = wav.to(device, non_blocking=True)
            log_probs = model(wav).transpose(0, 1)
            input_lengths = torch.full((wav.size(0),), log_probs.size(0), dtype=torch.long)
            loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths, zero_infinity=True)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            for cb in callbacks:
                cb(step, loss.item())
            step += 1

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
