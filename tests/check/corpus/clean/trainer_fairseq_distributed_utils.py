"""Translation training in a fairseq-like layout: cfg sections and distributed_utils helpers."""
import logging
import math
import os
from argparse import Namespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.distributed import utils as distributed_utils
from torch import distributed as D
from torch.utils.data import DataLoader, Dataset, DistributedSampler

logger = logging.getLogger("fairseq_cli.train")


class BitextPairs(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(4, 8000, (48,), generator=g), torch.randint(4, 8000, (48,), generator=g)


class TinyTransformerMT(nn.Module):
    def __init__(self, vocab=8000, dim=512):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=1)
        self.core = nn.Transformer(dim, 8, 3, 3, 2048, batch_first=True)
        self.proj = nn.Linear(dim, vocab)

    def forward(self, src, prev_output):
        tgt_mask = self.core.generate_square_subsequent_mask(prev_output.size(1), device=src.device)
        return self.proj(self.core(self.embed(src), self.embed(prev_output), tgt_mask=tgt_mask))


def label_smoothed_nll(lprobs, target, eps=0.1):
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.mean(-1)
    return ((1 - eps) * nll + eps * smooth).sum(), nll.sum()


def save_checkpoint(cfg, model, optimizer, epoch, val_loss):
    if not distributed_utils.is_master(cfg.distributed_training):
        return
    os.makedirs(cfg.checkpoint.save_dir, exist_ok=True)
    state = {"cfg": vars(cfg.checkpoint), "model": model.module.state_dict(),
             "last_optimizer_state": optimizer.state_dict(), "extra_state": {"epoch": epoch, "val_loss": val_loss}}
    torch.save(state, os.path.join(cfg.checkpoint.save_dir, "checkpoint_last.pt"))
    logger.info("saved checkpoint (epoch %d, val_loss %.3f)", epoch, val_loss)


def main(cfg):
    cfg.distributed_training.distributed_rank = int(os.environ["RANK"])
    cfg.distributed_training.device_id = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(cfg.distributed_training.device_id)
    D.init_process_group(backend="nccl")
    device = torch.device("cuda", cfg.distributed_training.device_id)
    if not distributed_utils.is_master(cfg.distributed_training):
        logging.getLogger().setLevel(logging.WARNING)

    model = TinyTransformerMT().to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[cfg.distributed_training.device_id])
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.optimization.lr, betas=(0.9, 0.98))
    dataset = BitextPairs()
    sampler = DistributedSampler(dataset, seed=cfg.common.seed)
    itr = DataLoader(dataset, batch_size=cfg.dataset.batch_size, sampler=sampler, num_workers=2)

    update_freq = cfg.optimization.update_freq
    for epoch in range(1, cfg.optimization.max_epoch + 1):
        sampler.set_epoch(epoch)
        model.train()
        log_output = torch.zeros(3, device=device)
        for i, (src, tgt) in enumerate(itr):
            src, tgt = src.to(device), tgt.to(device)
            prev = torch.cat([torch.full_like(tgt[:, :1], 2), tgt[:, :-1]], dim=1)
            lprobs = F.log_softmax(model(src, prev).float(), dim=-1)
            loss, nll = label_smoothed_nll(lprobs, tgt)
            ntokens = tgt.numel()
            (loss / (ntokens * update_freq)).backward()
            log_output += torch.tensor([loss.item(), nll.item(), ntokens], device=device)
            if (i + 1) % update_freq == 0:
                optimizer.step()
                optimizer.zero_grad()
        D.all_reduce(log_output)
        train_loss = (log_output[0] / log_output[2] / math.log(2)).item()
        if distributed_utils.is_master(cfg.distributed_training):
            logger.info("epoch %03d | loss %.3f | nll_loss %.3f", epoch, train_loss,
                        (log_output[1] / log_output[2] / math.log(2)).item())
        save_checkpoint(cfg, model, optimizer, epoch, train_loss)
    D.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    config = Namespace(
        common=Namespace(seed=1),
        dataset=Namespace(batch_size=64),
        optimization=Namespace(lr=5e-4, max_epoch=30, update_freq=4),
        checkpoint=Namespace(save_dir="checkpoints/transformer"),
        distributed_training=Namespace(distributed_rank=0, device_id=0),
    )
    main(config)
