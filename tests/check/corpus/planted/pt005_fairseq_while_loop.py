"""Translation training with a fairseq-like Trainer class: a while-loop over epochs, batches run in another method.

Planted: PT005 - Trainer.fit loops `while self.epoch <= max_epoch` and train_epoch() iterates the loader; set_epoch is never called.
"""
import logging
import math
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from nmt.data import LanguagePairDataset, collate_tokens
from nmt.models import TransformerModel

logger = logging.getLogger("nmt.train")


class Trainer:
    def __init__(self, cfg, model, dataset):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.device_id = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.device_id)
        self.model = DistributedDataParallel(model.to(self.device), device_ids=[self.device_id])
        self.sampler = DistributedSampler(dataset, seed=cfg["seed"])
        self.loader = DataLoader(dataset, batch_size=cfg["batch_size"], sampler=self.sampler, collate_fn=collate_tokens, num_workers=2)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg["lr"], betas=(0.9, 0.98), eps=1e-9)
        self.criterion = torch.nn.CrossEntropyLoss(ignore_index=cfg["pad"], label_smoothing=0.1)
        self.epoch = 1
        self.num_updates = 0

    def is_data_parallel_master(self):
        return self.rank == 0

    def train_step(self, sample):
        src = sample["net_input"]["src_tokens"].to(self.device, non_blocking=True)
        prev = sample["net_input"]["prev_output_tokens"].to(self.device, non_blocking=True)
        target = sample["target"].to(self.device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model(src, prev)
            loss = self.criterion(logits.view(-1, logits.size(-1)), target.view(-1))
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.1)
        self.optimizer.step()
        self.num_updates += 1
        return loss.detach()

    def train_epoch(self):
        self.model.train()
        agg = torch.zeros(2, device=self.device)
        for sample in self.loader:
            agg[0] += self.train_step(sample)
            agg[1] += 1
        dist.all_reduce(agg)
        return (agg[0] / agg[1]).item()

    def save_checkpoint(self, path):
        if self.is_data_parallel_master():
            state = {"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "epoch": self.epoch, "num_updates": self.num_updates}
            torch.save(state, path)

    def fit(self):
        max_epoch = self.cfg["max_epoch"]
        while self.epoch <= max_epoch:  # planted: PT005
            loss = self.train_epoch()
            if self.is_data_parallel_master():
                logger.info("epoch %03d | loss %.3f | ppl %.2f | num_updates %d", self.epoch, loss, math.pow(2, loss), self.num_updates)
            self.save_checkpoint(os.path.join(self.cfg["save_dir"], "checkpoint_last.pt"))
            self.epoch += 1


def cli_main():
    logging.basicConfig(level=logging.INFO)
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    cfg = {"seed": 1, "batch_size": 64, "lr": 5e-4, "pad": 1, "max_epoch": 40, "save_dir": "checkpoints"}
    dataset = LanguagePairDataset("data-bin/iwslt14.tokenized.de-en", split="train")
    model = TransformerModel.build(dataset.src_dict, dataset.tgt_dict)
    Trainer(cfg, model, dataset).fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    cli_main()
