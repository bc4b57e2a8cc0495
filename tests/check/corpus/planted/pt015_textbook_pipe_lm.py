"""Two-GPU pipeline-parallel Transformer language model on WikiText-2 (GPipe schedule).

Planted: PT015 - the model is built with torch.distributed.pipeline.sync.Pipe
"""
import logging
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import rpc
from torch.distributed.pipeline.sync import Pipe

logger = logging.getLogger("pipe_lm")
VOCAB, D_MODEL, BPTT = 28782, 512, 64


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)

    def forward(self, src):
        return self.tok(src) * math.sqrt(D_MODEL)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D_MODEL, VOCAB)

    def forward(self, h):
        return self.proj(h)


def layers(n):
    return [nn.TransformerEncoderLayer(D_MODEL, 8, 2048, dropout=0.1, batch_first=True) for _ in range(n)]


def batchify(ids, batch_size):
    n = ids.size(0) // batch_size
    return ids[: n * batch_size].view(batch_size, n)


def main():
    logging.basicConfig(level=logging.INFO)
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    rpc.init_rpc("worker", rank=0, world_size=1)

    stage0 = nn.Sequential(Embed(), *layers(6)).to("cuda:0")
    stage1 = nn.Sequential(*layers(6), Head()).to("cuda:1")
    model = Pipe(nn.Sequential(stage0, stage1), chunks=8)  # planted: PT015
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.95)

    train_ids = torch.randint(0, VOCAB, (2_000_000,))
    data = batchify(train_ids, 32)

    for epoch in range(3):
        model.train()
        for i in range(0, data.size(1) - 1 - BPTT, BPTT):
            src = data[:, i : i + BPTT].to("cuda:0")
            tgt = data[:, i + 1 : i + 1 + BPTT].to("cuda:1")
            optimizer.zero_grad()
            logits = model(src).local_value()
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
        scheduler.step()
        logger.info("epoch %d ppl %.2f", epoch, math.exp(loss.item()))

    rpc.shutdown()


if __name__ == "__main__":
    main()
