"""Speech recognition trainer with a fairseq-like train_step over a list of samples (update_freq).

Planted: PT023 - the no_sync context is chosen from world_size > 1 instead of "not the last sample", so in DDP every backward skips the all-reduce
"""
import contextlib
import logging
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from asr.data import AsrDataset, collate
from asr.model import Conformer

logger = logging.getLogger(__name__)


class Trainer:
    def __init__(self, model, lr, update_freq):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device(f"cuda:{self.local_rank}")
        self.model = DistributedDataParallel(model.to(self.device), device_ids=[self.local_rank])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.98))
        self.scaler = torch.amp.GradScaler("cuda")
        self.update_freq = update_freq

    def _loss(self, sample):
        feats = sample["features"].to(self.device, non_blocking=True)
        feat_lens = sample["feature_lengths"].to(self.device)
        targets = sample["targets"].to(self.device)
        target_lens = sample["target_lengths"].to(self.device)
        with torch.autocast("cuda", dtype=torch.float16):
            log_probs, out_lens = self.model(feats, feat_lens)
        loss = F.ctc_loss(log_probs.float().transpose(0, 1), targets, out_lens, target_lens,
                          reduction="sum", zero_infinity=True)
        return loss, int(target_lens.sum())

    def train_step(self, samples):
        self.model.train()
        self.optimizer.zero_grad()
        logging_loss = torch.zeros(2, device=self.device)
        for i, sample in enumerate(samples):
            sync_ctx = self.model.no_sync() if self.world_size > 1 else contextlib.nullcontext()  # planted: PT023
            with sync_ctx:
                loss, ntok = self._loss(sample)
                self.scaler.scale(loss / len(samples)).backward()
            logging_loss[0] += loss.detach()
            logging_loss[1] += ntok
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 10.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        dist.all_reduce(logging_loss)
        return (logging_loss[0] / logging_loss[1]).item()


def main():
    logging.basicConfig(level=logging.INFO)
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dataset = AsrDataset("/data/librispeech/train-960")
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, collate_fn=collate, num_workers=4)
    trainer = Trainer(Conformer(num_classes=dataset.vocab_size), lr=2e-3, update_freq=4)

    for epoch in range(60):
        sampler.set_epoch(epoch)
        group = []
        for sample in loader:
            group.append(sample)
            if len(group) < trainer.update_freq:
                continue
            loss = trainer.train_step(group)
            group = []
        if trainer.rank == 0:
            logger.info("epoch %d done, last update loss/token %.4f", epoch, loss)
            torch.save({"model": trainer.model.module.state_dict(), "epoch": epoch},
                       f"checkpoints/conformer_{epoch}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
