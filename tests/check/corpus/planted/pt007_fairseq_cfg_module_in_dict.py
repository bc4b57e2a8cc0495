"""Translation transformer training with fairseq-style nested cfg objects (no fairseq import).

torchrun --nproc_per_node=8 train_mt.py
Planted: PT007 - checkpoint dict stores model_without_ddp (a whole nn.Module) under "model"
"""
import logging
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("fairseq_cli.train")


def make_cfg():
    return SimpleNamespace(
        distributed_training=SimpleNamespace(distributed_rank=0, device_id=0, distributed_world_size=1),
        optimization=SimpleNamespace(max_epoch=30, lr=[5e-4], clip_norm=0.0),
        dataset=SimpleNamespace(batch_size=64, num_workers=2),
        checkpoint=SimpleNamespace(save_dir="checkpoints/transformer_wmt", save_interval=1),
        model=SimpleNamespace(embed_dim=256, layers=3, vocab=32000),
    )


class TransformerMT(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.embed = nn.Embedding(m.vocab, m.embed_dim, padding_idx=1)
        self.net = nn.Transformer(m.embed_dim, 4, m.layers, m.layers, 4 * m.embed_dim, batch_first=True)
        self.out = nn.Linear(m.embed_dim, m.vocab)

    def forward(self, src_tokens, prev_output_tokens):
        mask = self.net.generate_square_subsequent_mask(prev_output_tokens.size(1), device=src_tokens.device)
        h = self.net(self.embed(src_tokens), self.embed(prev_output_tokens), tgt_mask=mask)
        return self.out(h)


def distributed_init(cfg):
    dist.init_process_group(backend="nccl")
    cfg.distributed_training.distributed_rank = dist.get_rank()
    cfg.distributed_training.distributed_world_size = dist.get_world_size()
    cfg.distributed_training.device_id = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(cfg.distributed_training.device_id)


def main(cfg):
    distributed_init(cfg)
    dcfg = cfg.distributed_training
    device = torch.device("cuda", dcfg.device_id)
    is_master = dcfg.distributed_rank == 0

    src = torch.randint(2, cfg.model.vocab, (100000, 40))
    tgt = torch.randint(2, cfg.model.vocab, (100000, 42))
    dataset = TensorDataset(src, tgt)
    sampler = DistributedSampler(dataset, num_replicas=dcfg.distributed_world_size, rank=dcfg.distributed_rank)
    itr = DataLoader(dataset, batch_size=cfg.dataset.batch_size, sampler=sampler, num_workers=cfg.dataset.num_workers)

    model = TransformerMT(cfg.model).to(device)
    model = DistributedDataParallel(model, device_ids=[dcfg.device_id])
    model_without_ddp = model.module
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.optimization.lr[0], betas=(0.9, 0.98))

    epoch_itr = 1
    while epoch_itr <= cfg.optimization.max_epoch:
        sampler.set_epoch(epoch_itr)
        model.train()
        for i, (src_tokens, target) in enumerate(itr):
            src_tokens, target = src_tokens.to(device), target.to(device)
            logits = model(src_tokens, target[:, :-1])
            loss = F.cross_entropy(logits.transpose(1, 2), target[:, 1:], ignore_index=1, label_smoothing=0.1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if is_master and i % 100 == 0:
                logger.info("epoch %03d | update %d | loss %.3f", epoch_itr, i, loss.item())
        if is_master and epoch_itr % cfg.checkpoint.save_interval == 0:
            os.makedirs(cfg.checkpoint.save_dir, exist_ok=True)
            ckpt_path = os.path.join(cfg.checkpoint.save_dir, f"checkpoint{epoch_itr}.pt")
            torch.save({"model": model_without_ddp, "extra_state": {"epoch": epoch_itr}}, ckpt_path)  # planted: PT007
        epoch_itr += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main(make_cfg())
