"""Symbolic music language model (MIDI event tokens) trained for a fixed number of passes.

The training loop consumes one flat stream of batches produced by a generator that runs the
epochs itself with `yield from`.

Planted: PT005 - the generator's epoch loop re-iterates the loader without sampler.set_epoch
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("midi_lm")
VOCAB = 388  # note-on, note-off, time-shift and velocity events


class EventWindows(Dataset):
    def __init__(self, n_windows: int = 500_000, length: int = 1024) -> None:
        self.n_windows, self.length = n_windows, length

    def __len__(self) -> int:
        return self.n_windows

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randint(0, VOCAB, (self.length + 1,))


class MusicLM(nn.Module):
    def __init__(self, d: int = 512, layers: int = 6, heads: int = 8, max_len: int = 2048) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.size(1)
        mask = torch.triu(torch.full((t, t), float("-inf"), device=ids.device), diagonal=1)
        h = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        return self.head(self.body(h, mask=mask))


def batch_stream(loader: DataLoader, passes: int) -> Iterator[tuple[int, torch.Tensor]]:
    for epoch in range(passes):  # planted: PT005
        for seq in loader:
            yield epoch, seq


def stream_with_warmup(loader: DataLoader, passes: int) -> Iterator[tuple[int, torch.Tensor]]:
    yield from batch_stream(loader, passes)


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()
    logging.basicConfig(level=logging.INFO)

    model = DDP(MusicLM().to(device), device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.98), weight_decay=0.1)

    data = EventWindows()
    sampler = DistributedSampler(data, shuffle=True, drop_last=True)
    loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=4, pin_memory=True)

    window = torch.zeros(2, device=device)
    last_epoch = 0
    for epoch, seq in stream_with_warmup(loader, passes=8):
        seq = seq.to(device, non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(seq[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), seq[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        window += torch.stack([loss.detach(), torch.ones((), device=device)])
        if epoch != last_epoch:
            dist.all_reduce(window)
            if rank == 0:
                logger.info("pass %d nll %.4f", last_epoch, (window[0] / window[1]).item())
                torch.save(model.module.state_dict(), f"music_lm_pass{last_epoch}.pt")
            window.zero_()
            last_epoch = epoch

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
