"""Masked language modelling on protein sequences (ESM-style) with resumable training, Hydra config.

Planted: PT005 - set_epoch is called once with the resume epoch before the while loop, never per epoch
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
AMINO = "ACDEFGHIKLMNPQRSTVWY"
PAD, MASK = len(AMINO), len(AMINO) + 1


class UniRefCrops(Dataset):
    def __init__(self, n: int, crop: int):
        self.n, self.crop = n, crop

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.randint(0, len(AMINO), (self.crop,))


class ProteinEncoder(nn.Module):
    def __init__(self, dim: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(len(AMINO) + 2, dim, padding_idx=PAD)
        self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, 16, 4 * dim, batch_first=True), layers)
        self.lm_head = nn.Linear(dim, len(AMINO))

    def forward(self, tokens):
        return self.lm_head(self.body(self.embed(tokens)))


def mask_tokens(seq: torch.Tensor, p: float = 0.15):
    chosen = torch.rand(seq.shape, device=seq.device) < p
    inputs = seq.masked_fill(chosen, MASK)
    targets = seq.masked_fill(~chosen, -100)
    return inputs, targets


@hydra.main(config_path="configs", config_name="protein_mlm", version_base=None)
def train(cfg: DictConfig) -> None:
    dist.init_process_group("nccl")
    cfg.trainer.local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(cfg.trainer.local_rank)
    device = torch.device("cuda", cfg.trainer.local_rank)
    is_master = dist.get_rank() == 0

    model = ProteinEncoder(cfg.model.dim, cfg.model.layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, weight_decay=0.01)
    ckpt_path = Path(cfg.trainer.ckpt_dir) / "last.pt"
    start_epoch = 0
    if ckpt_path.exists():
        state = torch.load(ckpt_path, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start_epoch = state["epoch"] + 1
    model = DDP(model, device_ids=[cfg.trainer.local_rank])

    crops = UniRefCrops(cfg.data.n, cfg.data.crop)
    sampler = DistributedSampler(crops, seed=cfg.seed)
    loader = DataLoader(crops, batch_size=cfg.data.batch_size, sampler=sampler, num_workers=cfg.data.workers)

    sampler.set_epoch(start_epoch)
    epoch = start_epoch
    while epoch < cfg.trainer.max_epochs:  # planted: PT005
        model.train()
        agg = torch.zeros(2, device=device)
        for seq in loader:
            seq = seq.to(device, non_blocking=True)
            inputs, targets = mask_tokens(seq)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(inputs)
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            agg += torch.stack([loss.detach(), torch.ones((), device=device)])
        dist.all_reduce(agg)
        if is_master:
            log.info("epoch %d mlm loss %.4f", epoch, (agg[0] / agg[1]).item())
            ckpt_path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "epoch": epoch}, ckpt_path)
        epoch += 1

    dist.destroy_process_group()


if __name__ == "__main__":
    train()
