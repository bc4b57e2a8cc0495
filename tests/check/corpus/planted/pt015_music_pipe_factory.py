"""Symbolic-music (MIDI event) Transformer split across GPUs, configured with OmegaConf.

Planted: PT015 - the typed factory pipeline_parallel() builds the model with the removed pipeline.sync Pipe (module alias)
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.distributed.pipeline.sync as gpipe
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Dataset

log = logging.getLogger("midi")

DEFAULTS = OmegaConf.create(
    {
        "data": {"root": "maestro_events", "seq_len": 1024},
        "model": {"vocab": 388, "dim": 512, "heads": 8, "layers_per_stage": 4, "stages": 2},
        "pipe": {"chunks": 4, "checkpoint": "except_last"},
        "optim": {"lr": 1e-4, "epochs": 20, "batch_size": 16},
    }
)


class EventSequences(Dataset):
    def __init__(self, root: str, seq_len: int) -> None:
        self.files = sorted(Path(root).glob("*.pt"))
        self.seq_len = seq_len

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        events = torch.load(self.files[i], map_location="cpu", weights_only=True)
        return events[: self.seq_len + 1]


def make_stage(cfg: DictConfig, index: int) -> nn.Module:
    parts: list[nn.Module] = []
    if index == 0:
        parts.append(nn.Embedding(cfg.vocab, cfg.dim))
    parts += [
        nn.TransformerEncoderLayer(cfg.dim, cfg.heads, cfg.dim * 4, batch_first=True, norm_first=True)
        for _ in range(cfg.layers_per_stage)
    ]
    if index == cfg.stages - 1:
        parts += [nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, cfg.vocab)]
    return nn.Sequential(*parts).to(torch.device("cuda", index))


def pipeline_parallel(stages: list[nn.Module], pipe_cfg: DictConfig) -> nn.Module:
    seq = nn.Sequential(*stages)
    return gpipe.Pipe(seq, chunks=pipe_cfg.chunks, checkpoint=pipe_cfg.checkpoint)  # planted: PT015


def train(cfg: DictConfig) -> None:
    stages = [make_stage(cfg.model, i) for i in range(cfg.model.stages)]
    model = pipeline_parallel(stages, cfg.pipe)
    first = torch.device("cuda", 0)
    last = torch.device("cuda", cfg.model.stages - 1)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    loader = DataLoader(
        EventSequences(cfg.data.root, cfg.data.seq_len), batch_size=cfg.optim.batch_size, shuffle=True, drop_last=True
    )
    for epoch in range(cfg.optim.epochs):
        for seq in loader:
            inputs = seq[:, :-1].to(first)
            targets = seq[:, 1:].to(last)
            logits = model(inputs).local_value()
            loss = F.cross_entropy(logits.reshape(-1, cfg.model.vocab), targets.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        log.info("epoch %d nll %.4f", epoch, loss.item())


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    cfg = OmegaConf.merge(DEFAULTS, OmegaConf.from_cli())
    rpc.init_rpc("midi_worker", rank=0, world_size=1)
    try:
        train(cfg)
    finally:
        rpc.shutdown()


if __name__ == "__main__":
    main()
