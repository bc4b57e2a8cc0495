"""LoRA-style fine-tuning recipe class with warmup+cosine schedule and gradient accumulation.

Planted: PT027 - self._lr_scheduler.step() sits outside the `if` that steps the optimizer, so it advances every micro-batch
"""
import math
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class LoRALinear(nn.Module):
    def __init__(self, dim, rank=8, alpha=16):
        super().__init__()
        self.base = nn.Linear(dim, dim)
        self.base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(rank, dim) * 0.01)
        self.lora_b = nn.Parameter(torch.zeros(dim, rank))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale


def cosine_with_warmup(optimizer, warmup, total):
    def lr_lambda(step):
        if step < warmup:
            return step / max(1, warmup)
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


class LoRAFinetuneRecipe:
    def __init__(self, cfg):
        self.cfg = cfg
        self._device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        self._is_rank_zero = dist.get_rank() == 0

    def setup(self):
        model = nn.Sequential(nn.Embedding(32000, 512), *[LoRALinear(512) for _ in range(4)], nn.Linear(512, 32000))
        model[-1].requires_grad_(False)
        self._model = DDP(model.to(self._device), device_ids=[self._device.index])
        trainable = [p for p in self._model.parameters() if p.requires_grad]
        self._optimizer = torch.optim.AdamW(trainable, lr=self.cfg.lr)
        ds = TensorDataset(torch.randint(0, 32000, (16000, 129)))
        self._sampler = DistributedSampler(ds)
        self._loader = DataLoader(ds, batch_size=self.cfg.batch_size, sampler=self._sampler)
        total = self.cfg.epochs * len(self._loader) // self.cfg.gradient_accumulation_steps
        self._lr_scheduler = cosine_with_warmup(self._optimizer, self.cfg.num_warmup_steps, total)

    def train(self):
        accum = self.cfg.gradient_accumulation_steps
        for epoch in range(self.cfg.epochs):
            self._sampler.set_epoch(epoch)
            for idx, (tokens,) in enumerate(self._loader):
                tokens = tokens.to(self._device)
                logits = self._model(tokens[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()) / accum
                loss.backward()
                if (idx + 1) % accum == 0:
                    self._optimizer.step()
                    self._optimizer.zero_grad(set_to_none=True)
                self._lr_scheduler.step()  # planted: PT027
            if self._is_rank_zero:
                adapter = {k: v for k, v in self._model.module.state_dict().items() if "lora_" in k}
                torch.save(adapter, os.path.join(self.cfg.output_dir, f"adapter_{epoch}.pt"))


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    cfg = SimpleNamespace(lr=3e-4, batch_size=8, epochs=2, gradient_accumulation_steps=16,
                          num_warmup_steps=100, output_dir="/tmp/lora")
    recipe = LoRAFinetuneRecipe(cfg)
    recipe.setup()
    recipe.train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
