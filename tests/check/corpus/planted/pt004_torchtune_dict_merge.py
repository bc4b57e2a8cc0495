"""Full fine-tune recipe for a small causal LM, laid out like a torchtune recipe class (DDP).

tune-style launch: torchrun --nproc_per_node=8 full_finetune_ddp.py
Planted: PT004 - loader kwargs merged from defaults holding shuffle=True plus sampler=, passed as **kwargs
"""
import logging
import os
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger(__name__)

_LOADER_DEFAULTS = {"batch_size": 4, "shuffle": True, "num_workers": 2, "pin_memory": True, "drop_last": True}


class InstructDataset(Dataset):
    def __init__(self, n=20000, vocab=32000):
        self.n, self.vocab = n, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        length = 64 + i % 64
        return torch.randint(0, self.vocab, (length,))


def padded_collate(batch, padding_idx=0, ignore_idx=-100):
    tokens = nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=padding_idx)
    labels = nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=ignore_idx)
    return {"tokens": tokens, "labels": labels}


class TinyDecoder(nn.Module):
    def __init__(self, vocab=32000, dim=512, layers=4):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, 8, 4 * dim, batch_first=True, norm_first=True)
        self.layers = nn.TransformerEncoder(layer, layers)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.output(self.layers(self.tok(tokens), mask=mask, is_causal=True))


class FullFinetuneRecipeDDP:
    def __init__(self, cfg):
        self.cfg = cfg
        self._device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._is_rank_zero = self.rank == 0
        self.gradient_accumulation_steps = cfg["gradient_accumulation_steps"]

    def setup(self):
        model = TinyDecoder().to(self._device)
        self._model = DDP(model, device_ids=[self._device.index])
        self._optimizer = torch.optim.AdamW(self._model.parameters(), lr=self.cfg["lr"])
        self._lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self._optimizer, lambda s: min(1.0, (s + 1) / self.cfg["num_warmup_steps"]))
        self._sampler, self._dataloader = self._setup_data(InstructDataset())

    def _setup_data(self, ds):
        sampler = DistributedSampler(ds, num_replicas=self.world_size, rank=self.rank, seed=0)
        loader_kwargs = {**_LOADER_DEFAULTS, "sampler": sampler, "collate_fn": partial(padded_collate, padding_idx=0)}
        dataloader = DataLoader(ds, **loader_kwargs)  # planted: PT004
        return sampler, dataloader

    def train(self):
        self._optimizer.zero_grad(set_to_none=True)
        for curr_epoch in range(self.cfg["epochs"]):
            self._sampler.set_epoch(curr_epoch)
            for idx, batch in enumerate(self._dataloader):
                tokens = batch["tokens"].to(self._device)
                labels = batch["labels"].to(self._device)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = self._model(tokens)
                loss = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), labels[:, 1:], ignore_index=-100)
                loss = loss / self.gradient_accumulation_steps
                loss.backward()
                if (idx + 1) % self.gradient_accumulation_steps == 0:
                    self._optimizer.step()
                    self._optimizer.zero_grad(set_to_none=True)
                    self._lr_scheduler.step()
                    if self._is_rank_zero:
                        log.info("epoch %d step %d loss %.4f", curr_epoch, idx, loss.item() * self.gradient_accumulation_steps)
            self.save_checkpoint(curr_epoch)

    def save_checkpoint(self, epoch):
        if not self._is_rank_zero:
            return
        torch.save({"model": self._model.module.state_dict(), "epoch": epoch},
                   os.path.join(self.cfg["output_dir"], f"model_{epoch}.pt"))


def recipe_main():
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    logging.basicConfig(level=logging.INFO)
    cfg = {"lr": 2e-5, "epochs": 3, "gradient_accumulation_steps": 8, "num_warmup_steps": 100,
           "output_dir": "/tmp/ft-output"}
    recipe = FullFinetuneRecipeDDP(cfg)
    recipe.setup()
    recipe.train()
    dist.destroy_process_group()


if __name__ == "__main__":
    recipe_main()
