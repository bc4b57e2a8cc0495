"""LoRA fine-tuning of a frozen transformer block stack, with the DDP wrap hidden in a helper.

Planted: PT006 - the checkpoint helper saves net.state_dict() where net is the value returned by wrap() (a DDP)
"""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("lora")


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r: int = 8, alpha: int = 16) -> None:
        super().__init__()
        self.base = base
        self.base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(r, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, r))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = alpha / r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale


class Classifier(nn.Module):
    def __init__(self, vocab: int = 32_000, d: int = 768, n_layers: int = 6, n_labels: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.emb.requires_grad_(False)
        self.layers = nn.ModuleList(
            nn.Sequential(LoRALinear(nn.Linear(d, d)), nn.GELU(), LoRALinear(nn.Linear(d, d))) for _ in range(n_layers)
        )
        self.cls = nn.Linear(d, n_labels)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for layer in self.layers:
            h = h + layer(h)
        return self.cls(h[:, 0])


def setup() -> tuple[int, torch.device]:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return local_rank, torch.device("cuda", local_rank)


def wrap(model: nn.Module, local_rank: int) -> DDP:
    return DDP(model, device_ids=[local_rank], find_unused_parameters=False)


def save_checkpoint(net: nn.Module, opt: torch.optim.Optimizer, step: int, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step}, out / "lora_ft.pt")  # planted: PT006


def main() -> None:
    local_rank, device = setup()
    logging.basicConfig(level=logging.INFO)
    out_dir = Path(os.environ.get("OUT_DIR", "runs/lora"))

    net = Classifier().to(device)
    net = wrap(net, local_rank)
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0)

    ids = torch.randint(0, 32_000, (50_000, 128))
    labels = torch.randint(0, 3, (50_000,))
    ds = TensorDataset(ids, labels)
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=2, pin_memory=True)

    step = 0
    for epoch in range(3):
        sampler.set_epoch(epoch)
        hits = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = net(x)
            loss = F.cross_entropy(logits.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            hits += torch.stack([(logits.argmax(-1) == y).sum().float(), torch.tensor(float(y.numel()), device=device)])
        dist.all_reduce(hits)
        if dist.get_rank() == 0:
            logger.info("epoch %d train acc %.4f", epoch, (hits[0] / hits[1]).item())
            save_checkpoint(net, opt, step, out_dir)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
