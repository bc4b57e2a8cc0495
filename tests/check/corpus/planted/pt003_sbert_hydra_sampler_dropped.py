"""Contrastive sentence-embedding training (SBERT-style, in-batch negatives) driven by a Hydra config.

The sampler is passed into a loader helper, which forwards everything except the sampler to the
function that really builds the DataLoader.

Planted: PT003 - the DistributedSampler goes into make_loader but never reaches DataLoader
"""
import logging
import os

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


class PairDataset(Dataset):
    def __init__(self, n: int, seq_len: int, vocab: int):
        self.n, self.seq_len, self.vocab = n, seq_len, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        anchor = torch.randint(0, self.vocab, (self.seq_len,), generator=g)
        positive = torch.randint(0, self.vocab, (self.seq_len,), generator=g)
        return anchor, positive


class MeanPoolEncoder(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        enc_layer = nn.TransformerEncoderLayer(dim, nhead=8, batch_first=True)
        self.enc = nn.TransformerEncoder(enc_layer, layers)

    def forward(self, ids):
        return F.normalize(self.enc(self.emb(ids)).mean(1), dim=-1)


def _collated_loader(dataset, batch_size, workers):
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                      pin_memory=True, drop_last=True)


def make_loader(dataset, cfg, sampler):
    return _collated_loader(dataset, cfg.data.batch_size, cfg.data.workers)


@hydra.main(config_path="conf", config_name="sbert", version_base="1.3")
def main(cfg: DictConfig) -> None:
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    encoder = MeanPoolEncoder(cfg.model.vocab, cfg.model.dim, cfg.model.layers).to(device)
    encoder = DDP(encoder, device_ids=[local_rank])
    opt = torch.optim.AdamW(encoder.parameters(), lr=cfg.optim.lr, weight_decay=0.01)

    pairs = PairDataset(cfg.data.size, cfg.data.seq_len, cfg.model.vocab)
    sampler = DistributedSampler(pairs, seed=cfg.seed)  # planted: PT003
    loader = make_loader(pairs, cfg, sampler)

    for epoch in range(cfg.trainer.epochs):
        sampler.set_epoch(epoch)
        stats = torch.zeros(2, device=device)
        for anchor, positive in loader:
            anchor = anchor.to(device, non_blocking=True)
            positive = positive.to(device, non_blocking=True)
            a, p = encoder(torch.cat([anchor, positive])).chunk(2)
            logits = a @ p.t() / cfg.model.temperature
            labels = torch.arange(a.size(0), device=device)
            loss = F.cross_entropy(logits, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            stats += torch.stack([loss.detach(), torch.ones((), device=device)])
        dist.all_reduce(stats)
        if rank == 0:
            log.info("epoch %d infonce %.4f", epoch, (stats[0] / stats[1]).item())
            torch.save(encoder.module.state_dict(), f"{cfg.trainer.out}/sbert.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
