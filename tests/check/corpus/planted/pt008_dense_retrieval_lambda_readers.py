"""Dense passage retrieval (bi-encoder, in-batch negatives) initialised from per-format weight readers.

Planted: PT008 - the ".pt" reader lambda calls torch.load with map_location but no weights_only=
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("dpr")

READERS: dict[str, Callable[[Path, torch.device], dict[str, torch.Tensor]]] = {
    ".safetensors": lambda p, loc: load_file(str(p), device=str(loc)),
    ".pt": lambda p, loc: torch.load(p, map_location=loc),  # planted: PT008
}


class QuestionPassage(Dataset):
    def __len__(self) -> int:
        return 58_880

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randint(0, 30_522, (64,)), torch.randint(0, 30_522, (256,))


class Tower(nn.Module):
    def __init__(self, vocab: int = 30_522, d: int = 768, layers: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 12, 3072, batch_first=True), layers)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.enc(self.tok(ids))[:, 0]


class BiEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = Tower()
        self.p = Tower()

    def forward(self, q_ids: torch.Tensor, p_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q(q_ids), self.p(p_ids)


def init_from(tower: Tower, path: Path, loc: torch.device) -> None:
    state = READERS[path.suffix](path, loc)
    missing, unexpected = tower.load_state_dict(state, strict=False)
    logger.debug("loaded %s (missing=%d unexpected=%d)", path.name, len(missing), len(unexpected))


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO if dist.get_rank() == 0 else logging.WARNING)

    model = BiEncoder().to(device)
    pretrained = Path(os.environ.get("PRETRAINED", "weights/bert_base.pt"))
    init_from(model.q, pretrained, device)
    init_from(model.p, pretrained, device)
    model = DDP(model, device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)

    data = QuestionPassage()
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=4, drop_last=True)

    for epoch in range(40):
        sampler.set_epoch(epoch)
        rank_hits = torch.zeros(2, device=device)
        for q_ids, p_ids in loader:
            q_ids = q_ids.to(device, non_blocking=True)
            p_ids = p_ids.to(device, non_blocking=True)
            q, p = model(q_ids, p_ids)
            scores = q @ p.t()
            target = torch.arange(q.size(0), device=device)
            loss = F.cross_entropy(scores, target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rank_hits[0] += (scores.argmax(1) == target).sum()
            rank_hits[1] += q.size(0)
        dist.all_reduce(rank_hits)
        if dist.get_rank() == 0:
            logger.info("epoch %d in-batch top1 %.4f", epoch, (rank_hits[0] / rank_hits[1]).item())
            torch.save({"q": model.module.q.state_dict(), "p": model.module.p.state_dict()}, "dpr_biencoder.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
