"""Protein residue-contact prediction from sequence embeddings; accumulation state lives on self.state.

Planted: PT022 - train_step() clears gradients on every call, but the optimizer only steps when state.micro_step hits accum
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

log = logging.getLogger("contacts")
AMINO = "ACDEFGHIKLMNPQRSTVWY"


@dataclass
class State:
    micro_step: int = 0
    opt_step: int = 0
    history: list[float] = field(default_factory=list)


class ContactSet(Dataset):
    def __init__(self, root: Path, crop: int = 256) -> None:
        self.files = sorted(root.glob("*.pt"))
        self.crop = crop

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        rec = torch.load(self.files[i], map_location="cpu", weights_only=True)
        L = min(self.crop, rec["seq"].numel())
        return rec["seq"][:L], rec["contacts"][:L, :L].float()


class ContactModel(nn.Module):
    def __init__(self, dim: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(AMINO) + 1, dim)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, 8, dim * 4, batch_first=True), 4)
        self.pair = nn.Sequential(nn.Conv2d(dim * 2, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 1, 3, padding=1))

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(seq))
        L = h.size(1)
        pair = torch.cat([h[:, :, None].expand(-1, -1, L, -1), h[:, None].expand(-1, L, -1, -1)], dim=-1)
        logits = self.pair(pair.permute(0, 3, 1, 2)).squeeze(1)
        return 0.5 * (logits + logits.transpose(1, 2))


class ContactTrainer:
    def __init__(self, dataset: ContactSet, accum: int = 16) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.accum = accum
        self.state = State()
        self.model = DDP(ContactModel().to(self.device), device_ids=[self.local_rank])
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=1, sampler=self.sampler, num_workers=2)

    def loss_fn(self, seq: torch.Tensor, contacts: torch.Tensor) -> torch.Tensor:
        logits = self.model(seq)
        return F.binary_cross_entropy_with_logits(logits, contacts, pos_weight=torch.tensor(5.0, device=self.device))

    def train_step(self, seq: torch.Tensor, contacts: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)  # planted: PT022
        loss = self.loss_fn(seq.to(self.device), contacts.to(self.device)) / self.accum
        loss.backward()
        self.state.micro_step += 1
        if self.state.micro_step % self.accum == 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.state.opt_step += 1

    def run(self, epochs: int) -> None:
        for epoch in range(epochs):
            self.sampler.set_epoch(epoch)
            self.model.train()
            for seq, contacts in self.loader:
                self.train_step(seq, contacts)
            if dist.get_rank() == 0:
                log.info("epoch %d: %d optimizer steps", epoch, self.state.opt_step)
                torch.save(self.model.module.state_dict(), Path("contact_model.pt"))


def main() -> None:
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    logging.basicConfig(level=logging.INFO)
    ContactTrainer(ContactSet(Path("pdb_contacts/train"))).run(epochs=20)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
