"""Full fine-tuning recipe class (setup / train / save_checkpoint) for a causal LM under DDP.

Planted: PT019 - loss.backward() on every batch, optimizer steps every self._gradient_accumulation_steps, loss never scaled down
"""
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class InstructDataset(Dataset):
    def __init__(self, n=8000, seq_len=256, vocab=32000):
        self.tokens = torch.randint(0, vocab, (n, seq_len + 1))

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, idx):
        row = self.tokens[idx]
        return {"tokens": row[:-1], "labels": row[1:]}


class FullFinetuneRecipeDistributed:
    def __init__(self, cfg):
        self._cfg = cfg
        self._device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        self._is_rank_zero = dist.get_rank() == 0
        self._gradient_accumulation_steps = cfg.gradient_accumulation_steps
        self.epochs_run = 0
        self.global_step = 0

    def setup(self):
        base = nn.Sequential(nn.Embedding(32000, 512),
                             nn.TransformerEncoder(nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True), 4),
                             nn.Linear(512, 32000))
        self._model = DDP(base.to(self._device), device_ids=[self._device.index])
        self._optimizer = torch.optim.AdamW(self._model.parameters(), lr=self._cfg.lr, fused=True)
        self._loss_fn = nn.CrossEntropyLoss(ignore_index=-100)
        ds = InstructDataset()
        self._sampler = DistributedSampler(ds, shuffle=True, seed=0)
        self._dataloader = DataLoader(ds, batch_size=self._cfg.batch_size, sampler=self._sampler, drop_last=True)
        steps = self._cfg.epochs * len(self._dataloader) // self._gradient_accumulation_steps
        self._lr_scheduler = torch.optim.lr_scheduler.OneCycleLR(self._optimizer, self._cfg.lr, total_steps=steps)

    def save_checkpoint(self, epoch):
        if not self._is_rank_zero:
            return
        state = {"model": self._model.module.state_dict(), "optimizer": self._optimizer.state_dict(),
                 "epochs_run": epoch + 1, "global_step": self.global_step}
        torch.save(state, os.path.join(self._cfg.output_dir, f"epoch_{epoch}.pt"))

    def train(self):
        self._optimizer.zero_grad(set_to_none=True)
        for curr_epoch in range(self.epochs_run, self._cfg.epochs):
            self._sampler.set_epoch(curr_epoch)
            self._model.train()
            for idx, batch in enumerate(self._dataloader):
                tokens = batch["tokens"].to(self._device)
                labels = batch["labels"].to(self._device)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = self._model(tokens)
                loss = self._loss_fn(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1))
                loss.backward()  # planted: PT019
                if (idx + 1) % self._gradient_accumulation_steps == 0:
                    torch.nn.utils.clip_grad_norm_(self._model.parameters(), 1.0)
                    self._optimizer.step()
                    self._optimizer.zero_grad(set_to_none=True)
                    self._lr_scheduler.step()
                    self.global_step += 1
                    if self._is_rank_zero and self.global_step % self._cfg.log_every_n_steps == 0:
                        print(f"{curr_epoch + 1}|{self.global_step}|Loss: {loss.item():.4f}")
            self.epochs_run += 1
            self.save_checkpoint(curr_epoch)


def recipe_main():
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    cfg = SimpleNamespace(lr=2e-5, batch_size=4, epochs=3, gradient_accumulation_steps=8,
                          log_every_n_steps=10, output_dir="/tmp/full-ft")
    recipe = FullFinetuneRecipeDistributed(cfg)
    recipe.setup()
    recipe.train()
    dist.destroy_process_group()


if __name__ == "__main__":
    recipe_main()
