"""Two-stage pipelined transformer language model on two GPUs of one host, micro-batched.

Planted: PT015 - imports Pipe (aliased GPipe) from the removed torch.distributed.pipeline.sync
"""
import logging
import math
import tempfile

import torch
import torch.nn as nn
from torch.distributed import rpc
from torch.distributed.pipeline.sync import Pipe as GPipe  # planted: PT015

logging.basicConfig(level=logging.INFO)
log = logging.getLogger(__name__)

VOCAB, D_MODEL, N_LAYERS, BPTT = 10000, 256, 8, 35


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D_MODEL)

    def forward(self, src):
        return self.emb(src) * math.sqrt(D_MODEL)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D_MODEL, VOCAB)

    def forward(self, x):
        return self.proj(x)


def make_stage(n_layers, device, first=False, last=False):
    mods = [Embed()] if first else []
    mods += [nn.TransformerEncoderLayer(D_MODEL, 4, 1024, dropout=0.1, batch_first=True) for _ in range(n_layers)]
    if last:
        mods.append(Head())
    return nn.Sequential(*mods).to(device)


def batches(stream, batch_size):
    n = stream.size(0) // (batch_size * (BPTT + 1))
    data = stream[: n * batch_size * (BPTT + 1)].view(n, batch_size, BPTT + 1)
    for chunk in data:
        yield chunk[:, :-1], chunk[:, 1:]


def main():
    tmp = tempfile.NamedTemporaryFile()
    rpc.init_rpc("worker", rank=0, world_size=1,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(init_method=f"file://{tmp.name}"))
    stage0 = make_stage(N_LAYERS // 2, "cuda:0", first=True)
    stage1 = make_stage(N_LAYERS // 2, "cuda:1", last=True)
    model = GPipe(nn.Sequential(stage0, stage1), chunks=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.95)
    criterion = nn.CrossEntropyLoss()
    corpus = torch.randint(0, VOCAB, (2_000_000,))

    for epoch in range(3):
        model.train()
        total = 0.0
        for i, (src, tgt) in enumerate(batches(corpus, 32)):
            src = src.to("cuda:0")
            tgt = tgt.to("cuda:1")
            optimizer.zero_grad()
            out = model(src).local_value()
            loss = criterion(out.reshape(-1, VOCAB), tgt.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            total += loss.item()
            if (i + 1) % 200 == 0:
                log.info("epoch %d batch %d ppl %.2f", epoch, i + 1, math.exp(total / 200))
                total = 0.0
        scheduler.step()
    rpc.shutdown()


if __name__ == "__main__":
    main()
