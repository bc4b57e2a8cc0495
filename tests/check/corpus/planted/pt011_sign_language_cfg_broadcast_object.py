"""Continuous sign-language recognition (pose keypoint sequences -> gloss CTC) with an OmegaConf config.

Rank 0 reads the annotation file once to build the gloss vocabulary and shares it with the others.

Planted: PT011 - broadcast_object_list is inside `if cfg.trainer.rank == 0:`; the other ranks never join it
"""
import logging
import os
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger(__name__)


def build_vocab(annotations: Path) -> list:
    glosses = set()
    if annotations.is_file():
        for line in annotations.read_text().splitlines():
            glosses.update(line.split("|")[-1].split())
    return ["<blank>"] + sorted(glosses or {f"G{i}" for i in range(1085)})


class KeypointVideos(Dataset):
    def __init__(self, n: int, vocab_size: int):
        self.n, self.vocab_size = n, vocab_size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.randn(128, 133 * 2), torch.randint(1, self.vocab_size, (12,))


class GlossRecognizer(nn.Module):
    def __init__(self, vocab_size: int, d: int = 512):
        super().__init__()
        self.inp = nn.Linear(133 * 2, d)
        self.temporal = nn.Conv1d(d, d, 5, padding=2)
        self.rnn = nn.LSTM(d, d // 2, num_layers=2, bidirectional=True, batch_first=True)
        self.cls = nn.Linear(d, vocab_size)

    def forward(self, kp):
        h = F.relu(self.temporal(self.inp(kp).transpose(1, 2))).transpose(1, 2)
        h, _ = self.rnn(h)
        return self.cls(h)


@hydra.main(config_path="configs", config_name="slr", version_base=None)
def main(cfg: DictConfig) -> None:
    dist.init_process_group("nccl")
    cfg.trainer.rank = dist.get_rank()
    cfg.trainer.local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(cfg.trainer.local_rank)
    device = torch.device("cuda", cfg.trainer.local_rank)

    payload = [None]
    if cfg.trainer.rank == 0:
        payload[0] = build_vocab(Path(cfg.data.annotations))
        dist.broadcast_object_list(payload, src=0)  # planted: PT011
    vocab = payload[0]

    model = DDP(GlossRecognizer(len(vocab)).to(device), device_ids=[cfg.trainer.local_rank])
    opt = torch.optim.Adam(model.parameters(), lr=cfg.optim.lr)
    ctc = nn.CTCLoss(blank=0, zero_infinity=True)

    videos = KeypointVideos(cfg.data.size, len(vocab))
    sampler = DistributedSampler(videos, seed=cfg.seed)
    loader = DataLoader(videos, batch_size=cfg.data.batch_size, sampler=sampler, num_workers=cfg.data.workers)

    for epoch in range(cfg.trainer.epochs):
        sampler.set_epoch(epoch)
        acc = torch.zeros(2, device=device)
        for kp, gloss in loader:
            kp, gloss = kp.to(device), gloss.to(device)
            log_probs = model(kp).log_softmax(-1).transpose(0, 1)
            in_len = torch.full((kp.size(0),), log_probs.size(0), dtype=torch.long, device=device)
            tgt_len = torch.full((kp.size(0),), gloss.size(1), dtype=torch.long, device=device)
            loss = ctc(log_probs, gloss, in_len, tgt_len)
            opt.zero_grad()
            loss.backward()
            opt.step()
            acc += torch.stack([loss.detach(), torch.ones((), device=device)])
        dist.all_reduce(acc)
        if cfg.trainer.rank == 0:
            log.info("epoch %d ctc %.4f", epoch, (acc[0] / acc[1]).item())
            torch.save({"model": model.module.state_dict(), "vocab": vocab}, Path(cfg.trainer.out) / "slr.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
