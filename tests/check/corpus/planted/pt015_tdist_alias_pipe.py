"""Pipeline-parallel BERT-style encoder pretraining inside a small Trainer class.

Planted: PT015 - Trainer builds the pipeline with tdist.pipeline.sync.Pipe, the removed API reached through an alias
"""
import logging
import os

import torch
import torch.distributed as tdist
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from mlm_data import MaskedLMDataset

logger = logging.getLogger("pipe_mlm")


class Embeddings(nn.Module):
    def __init__(self, vocab, dim, max_len=512):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, ids):
        positions = torch.arange(ids.size(1), device=ids.device)
        return self.norm(self.tok(ids) + self.pos(positions))


class Trainer:
    def __init__(self, vocab=30522, dim=1024, layers=24, chunks=16, lr=1e-4):
        self.vocab = vocab
        n_dev = torch.cuda.device_count()
        per_dev = layers // n_dev
        blocks = [Embeddings(vocab, dim).to("cuda:0")]
        for i in range(layers):
            blocks.append(nn.TransformerEncoderLayer(dim, 16, 4 * dim, batch_first=True).to(f"cuda:{i // per_dev}"))
        blocks.append(nn.Linear(dim, vocab).to(f"cuda:{n_dev - 1}"))
        self.out_device = torch.device("cuda", n_dev - 1)
        self.model = tdist.pipeline.sync.Pipe(nn.Sequential(*blocks), chunks=chunks)  # planted: PT015
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.01)
        self.step = 0

    def train_step(self, batch):
        ids = batch["input_ids"].to("cuda:0", non_blocking=True)
        labels = batch["labels"].to(self.out_device, non_blocking=True)
        logits = self.model(ids).local_value()
        loss = F.cross_entropy(logits.view(-1, self.vocab), labels.view(-1), ignore_index=-100)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.step += 1
        return loss.item()

    def fit(self, loader, epochs):
        for epoch in range(epochs):
            for batch in loader:
                loss = self.train_step(batch)
                if self.step % 50 == 0:
                    logger.info("epoch %d step %d mlm loss %.4f", epoch, self.step, loss)


def main():
    logging.basicConfig(level=logging.INFO)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29501")
    rpc.init_rpc("pipe_worker", rank=0, world_size=1)
    loader = DataLoader(MaskedLMDataset("./corpus"), batch_size=64, shuffle=True, num_workers=4)
    Trainer().fit(loader, epochs=3)
    rpc.shutdown()


if __name__ == "__main__":
    main()
