"""Full-parameter fine-tuning recipe for a decoder-only LM, sharded with FSDP2."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, Dataset, DistributedSampler

log = logging.getLogger("recipe")


@dataclass
class RecipeConfig:
    vocab_size: int = 32000
    dim: int = 1024
    n_layers: int = 8
    seq_len: int = 1024
    batch_size: int = 4
    epochs: int = 3
    lr: float = 2e-5
    gradient_accumulation_steps: int = 8
    output_dir: str = "/tmp/full_ft"
    resume_from: str | None = None


class DecoderBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 16, batch_first=True)
        self.norm2 = nn.RMSNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        mask = nn.Transformer.generate_square_subsequent_mask(x.size(1), device=x.device)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyDecoder(nn.Module):
    def __init__(self, cfg: RecipeConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(DecoderBlock(cfg.dim) for _ in range(cfg.n_layers))
        self.out = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


class PackedTokens(Dataset):
    def __init__(self, n: int, seq_len: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.data = torch.randint(0, vocab, (n, seq_len + 1), generator=g)

    def __len__(self) -> int:
        return self.data.size(0)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.data[i]
        return {"tokens": row[:-1], "labels": row[1:]}


class FullFinetuneRecipeDistributed:
    def __init__(self, cfg: RecipeConfig) -> None:
        self.cfg = cfg
        self._local_rank = int(os.environ["LOCAL_RANK"])
        self._device = torch.device("cuda", self._local_rank)
        torch.cuda.set_device(self._device)
        dist.init_process_group("nccl")
        self._is_rank_zero = dist.get_rank() == 0
        self.epochs_run = 0
        self.global_step = 0

    def setup(self) -> None:
        cfg = self.cfg
        with torch.device("meta"):
            model = TinyDecoder(cfg)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.layers:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        model.to_empty(device=self._device)
        for m in model.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
        self._model = model
        self._optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, fused=True)
        ds = PackedTokens(20_000, cfg.seq_len, cfg.vocab_size)
        self._sampler = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank(), seed=0)
        self._dataloader = DataLoader(ds, batch_size=cfg.batch_size, sampler=self._sampler,
                                      drop_last=True, pin_memory=True, num_workers=2)
        if cfg.resume_from:
            model_sd, optim_sd = get_state_dict(self._model, self._optimizer)
            state = {"model": model_sd, "optim": optim_sd, "epoch": 0}
            dcp.load(state, checkpoint_id=cfg.resume_from)
            set_state_dict(self._model, self._optimizer,
                           model_state_dict=state["model"], optim_state_dict=state["optim"])
            self.epochs_run = int(state["epoch"]) + 1

    def save_checkpoint(self, epoch: int) -> None:
        model_sd, optim_sd = get_state_dict(self._model, self._optimizer)
        ckpt_dir = os.path.join(self.cfg.output_dir, f"epoch_{epoch}")
        dcp.save({"model": model_sd, "optim": optim_sd, "epoch": epoch}, checkpoint_id=ckpt_dir)
        if self._is_rank_zero:
            log.info("checkpoint written to %s", ckpt_dir)

    def train(self) -> None:
        cfg = self.cfg
        accum = cfg.gradient_accumulation_steps
        self._optimizer.zero_grad(set_to_none=True)
        running = torch.zeros((), device=self._device)
        t0 = time.perf_counter()
        for curr_epoch in range(self.epochs_run, cfg.epochs):
            self._sampler.set_epoch(curr_epoch)
            for idx, batch in enumerate(self._dataloader):
                tokens = batch["tokens"].to(self._device, non_blocking=True)
                labels = batch["labels"].to(self._device, non_blocking=True)
                logits = self._model(tokens)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
                loss = loss / accum
                running += loss.detach()
                loss.backward()
                if (idx + 1) % accum == 0:
                    torch.nn.utils.clip_grad_norm_(self._model.parameters(), 1.0)
                    self._optimizer.step()
                    self._optimizer.zero_grad(set_to_none=True)
                    self.global_step += 1
                    dist.all_reduce(running, op=dist.ReduceOp.AVG)
                    if self._is_rank_zero and self.global_step % 10 == 0:
                        dt = time.perf_counter() - t0
                        log.info("epoch %d step %d loss %.4f (%.1fs)", curr_epoch, self.global_step, running.item(), dt)
                    running.zero_()
            self.save_checkpoint(curr_epoch)

    def cleanup(self) -> None:
        dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    recipe = FullFinetuneRecipeDistributed(RecipeConfig())
    recipe.setup()
    recipe.train()
    recipe.cleanup()
