"""Translation model trainer in the fairseq style: a Trainer object owns model, criterion and optimizer.

Planted: PT021 - train_step forwards through the unwrapped net (self.model.module) rather than the DDP wrapper
"""
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from nmt.data import LanguagePairDataset, collate_pairs
from nmt.models import TransformerModel

logger = logging.getLogger("nmt.train")


class LabelSmoothedCrossEntropy(nn.Module):
    def __init__(self, eps, padding_idx):
        super().__init__()
        self.loss = nn.CrossEntropyLoss(ignore_index=padding_idx, label_smoothing=eps, reduction="sum")

    def forward(self, logits, sample):
        loss = self.loss(logits.view(-1, logits.size(-1)), sample["target"].view(-1))
        return loss, sample["ntokens"]


class Trainer:
    def __init__(self, cfg, model, criterion):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.criterion = criterion.to(self.device)
        self.model = DistributedDataParallel(model.to(self.device), device_ids=[self.local_rank])
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg["lr"], betas=(0.9, 0.98))
        self.num_updates = 0

    @property
    def unwrapped(self):
        return self.model.module if hasattr(self.model, "module") else self.model

    def _prepare_sample(self, sample):
        return {
            "net_input": {k: v.to(self.device, non_blocking=True) for k, v in sample["net_input"].items()},
            "target": sample["target"].to(self.device, non_blocking=True),
            "ntokens": sample["ntokens"],
        }

    def train_step(self, sample):
        self.model.train()
        sample = self._prepare_sample(sample)
        self.optimizer.zero_grad()
        net = self.model.module if hasattr(self.model, "module") else self.model
        logits = net(**sample["net_input"])  # planted: PT021
        loss, ntokens = self.criterion(logits, sample)
        (loss / ntokens).backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg["clip_norm"])
        self.optimizer.step()
        self.num_updates += 1
        return loss.detach(), ntokens

    @torch.no_grad()
    def valid_step(self, sample):
        self.model.eval()
        sample = self._prepare_sample(sample)
        logits = self.model(**sample["net_input"])
        return self.criterion(logits, sample)

    def sync_stats(self, loss_sum, ntokens):
        t = torch.stack([loss_sum.float(), torch.tensor(float(ntokens), device=self.device)])
        dist.all_reduce(t)
        return (t[0] / t[1]).item()

    def save_checkpoint(self, path, epoch):
        if self.rank == 0:
            torch.save({"model": self.unwrapped.state_dict(),
                        "optimizer": self.optimizer.state_dict(),
                        "epoch": epoch, "num_updates": self.num_updates}, path)


def main(cfg):
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    train_ds = LanguagePairDataset(cfg["data"], split="train")
    valid_ds = LanguagePairDataset(cfg["data"], split="valid")
    train_sampler = DistributedSampler(train_ds, seed=cfg["seed"])
    train_loader = DataLoader(train_ds, batch_size=cfg["batch_size"], sampler=train_sampler,
                              collate_fn=collate_pairs, num_workers=4)
    valid_loader = DataLoader(valid_ds, batch_size=cfg["batch_size"], collate_fn=collate_pairs,
                              sampler=DistributedSampler(valid_ds, shuffle=False))

    model = TransformerModel.build(cfg)
    criterion = LabelSmoothedCrossEntropy(cfg["label_smoothing"], train_ds.pad)
    trainer = Trainer(cfg, model, criterion)

    for epoch in range(1, cfg["max_epoch"] + 1):
        train_sampler.set_epoch(epoch)
        loss_sum = torch.zeros((), device=trainer.device)
        ntok = 0
        for sample in train_loader:
            loss, ntokens = trainer.train_step(sample)
            loss_sum += loss
            ntok += ntokens
        train_nll = trainer.sync_stats(loss_sum, ntok)

        vloss_sum = torch.zeros((), device=trainer.device)
        vtok = 0
        for sample in valid_loader:
            loss, ntokens = trainer.valid_step(sample)
            vloss_sum += loss
            vtok += ntokens
        valid_nll = trainer.sync_stats(vloss_sum, vtok)
        if trainer.rank == 0:
            logger.info("epoch %d | train nll %.3f | valid nll %.3f", epoch, train_nll, valid_nll)
        trainer.save_checkpoint(os.path.join(cfg["save_dir"], f"checkpoint{epoch}.pt"), epoch)
    dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main({"data": "data-bin/wmt16_en_de", "lr": 5e-4, "clip_norm": 0.0, "seed": 1,
          "batch_size": 64, "label_smoothing": 0.1, "max_epoch": 30, "save_dir": "checkpoints"})
