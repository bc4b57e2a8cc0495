"""Step-based LM pretraining loop in the shape of torchtitan's train.py (DDP, map-style data).

torchrun --nproc_per_node=8 train.py --training.steps 20000
Planted: PT005 - while True loop re-iterates the loader at each StopIteration (epoch += 1) without set_epoch
"""
import argparse
import logging
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("titan")


class TokenChunks(Dataset):
    def __init__(self, n_tokens=10_000_000, seq_len=512, vocab=50257):
        self.data = torch.randint(0, vocab, (n_tokens,), dtype=torch.int32)
        self.seq_len = seq_len

    def __len__(self):
        return (self.data.numel() - 1) // self.seq_len

    def __getitem__(self, i):
        chunk = self.data[i * self.seq_len: (i + 1) * self.seq_len + 1].long()
        return chunk[:-1], chunk[1:]


class Transformer(nn.Module):
    def __init__(self, vocab=50257, dim=512, n_layers=6, n_heads=8):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(dim, n_heads, 4 * dim, batch_first=True, norm_first=True), n_layers)
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.output(self.norm(self.layers(self.tok_embeddings(tokens), mask=mask, is_causal=True)))


def main(job):
    dist.init_process_group("nccl")
    world_mesh_rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}")
    torch.cuda.set_device(device)

    dataset = TokenChunks(seq_len=job.seq_len)
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=world_mesh_rank)
    dataloader = DataLoader(dataset, batch_size=job.batch_size, sampler=sampler, num_workers=2, drop_last=True)

    model = DDP(Transformer().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=job.lr, betas=(0.9, 0.95), weight_decay=0.1)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / job.warmup_steps))

    step, epoch = 0, 0
    data_iterator = iter(dataloader)
    t0 = time.perf_counter()
    while True:  # planted: PT005
        if step >= job.steps:
            break
        try:
            inputs, labels = next(data_iterator)
        except StopIteration:
            epoch += 1
            data_iterator = iter(dataloader)
            inputs, labels = next(data_iterator)
        step += 1
        inputs, labels = inputs.to(device), labels.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pred = model(inputs)
        loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), job.max_norm)
        optimizer.step()
        lr_scheduler.step()

        if step % job.log_freq == 0:
            global_avg_loss = loss.detach().clone()
            dist.all_reduce(global_avg_loss, op=dist.ReduceOp.AVG)
            if world_mesh_rank == 0:
                tps = job.log_freq * job.batch_size * job.seq_len / (time.perf_counter() - t0)
                logger.info("step: %d epoch: %d loss: %.4f tps(rank0): %.0f", step, epoch, global_avg_loss.item(), tps)
            t0 = time.perf_counter()
        if step % job.checkpoint_interval == 0 and world_mesh_rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                       os.path.join(job.dump_folder, f"step-{step}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--training.steps", dest="steps", type=int, default=20000)
    p.add_argument("--training.batch_size", dest="batch_size", type=int, default=8)
    p.add_argument("--training.seq_len", dest="seq_len", type=int, default=512)
    p.add_argument("--optimizer.lr", dest="lr", type=float, default=8e-4)
    p.add_argument("--lr_scheduler.warmup_steps", dest="warmup_steps", type=int, default=200)
    p.add_argument("--training.max_norm", dest="max_norm", type=float, default=1.0)
    p.add_argument("--metrics.log_freq", dest="log_freq", type=int, default=10)
    p.add_argument("--checkpoint.interval", dest="checkpoint_interval", type=int, default=1000)
    p.add_argument("--job.dump_folder", dest="dump_folder", default="./outputs")
    logging.basicConfig(level=logging.INFO)
    main(p.parse_args())
