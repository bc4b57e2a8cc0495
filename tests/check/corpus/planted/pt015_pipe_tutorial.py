"""Transformer language model split over two GPUs with pipeline parallelism (GPipe-style micro-batches).

Planted: PT015 - imports Pipe from torch.distributed.pipeline.sync, a module removed from PyTorch
"""
import logging
import math
import os
import tempfile

import torch
import torch.nn as nn
from torch.distributed import rpc
from torch.distributed.pipeline.sync import Pipe  # planted: PT015

logging.basicConfig(level=logging.INFO)
log = logging.getLogger("pipeline_lm")


class Encoder(nn.Module):
    def __init__(self, ntoken, ninp, dropout=0.5):
        super().__init__()
        self.embed = nn.Embedding(ntoken, ninp)
        self.drop = nn.Dropout(dropout)
        self.scale = math.sqrt(ninp)

    def forward(self, src):
        return self.drop(self.embed(src) * self.scale)


class Decoder(nn.Module):
    def __init__(self, ntoken, ninp):
        super().__init__()
        self.proj = nn.Linear(ninp, ntoken)

    def forward(self, inp):
        return self.proj(inp)


def build_stages(ntokens, emsize=4096, nhead=16, nhid=4096, nlayers=8, dropout=0.2):
    num_gpus = 2
    per_stage = (nlayers - 1) // num_gpus + 1
    layers = [Encoder(ntokens, emsize, dropout).cuda(0)]
    for i in range(nlayers):
        device = i // per_stage
        layers.append(nn.TransformerEncoderLayer(emsize, nhead, nhid, dropout, batch_first=True).to(device))
    layers.append(Decoder(ntokens, emsize).cuda(num_gpus - 1))
    return nn.Sequential(*layers)


def main():
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    tmpfile = tempfile.NamedTemporaryFile()
    rpc.init_rpc(name="worker", rank=0, world_size=1,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(init_method=f"file://{tmpfile.name}"))

    ntokens, bptt, batch_size = 28782, 35, 20
    train_data = torch.randint(0, ntokens, (10_000, batch_size))
    model = Pipe(build_stages(ntokens), chunks=8)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.95)

    for epoch in range(1, 4):
        model.train()
        for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
            seq_len = min(bptt, train_data.size(0) - 1 - i)
            data = train_data[i:i + seq_len].t().cuda(0)
            targets = train_data[i + 1:i + 1 + seq_len].t().cuda(1)
            optimizer.zero_grad()
            output = model(data).local_value()
            loss = criterion(output.reshape(-1, ntokens), targets.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            if batch % 200 == 0:
                log.info("| epoch %3d | %5d batches | loss %5.2f | ppl %8.2f",
                         epoch, batch, loss.item(), math.exp(loss.item()))
        scheduler.step()

    rpc.shutdown()


if __name__ == "__main__":
    main()
