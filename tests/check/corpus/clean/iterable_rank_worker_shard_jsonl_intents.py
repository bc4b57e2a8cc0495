import glob
import itertools
import json
import os
import random
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

VOCAB, N_INTENTS, MAX_LEN = 30_000, 150, 64


def hash_tokens(text: str) -> list[int]:
    return [zlib.crc32(w.encode()) % (VOCAB - 1) + 1 for w in text.lower().split()][:MAX_LEN]


class JsonlShards(IterableDataset):
    """Each (rank, worker) pair reads a disjoint slice of the shard files."""

    def __init__(self, pattern: str, rank: int, world: int, steps_per_epoch: int, seed: int = 0):
        self.files = sorted(glob.glob(pattern))
        self.rank, self.world, self.seed = rank, world, seed
        self.steps_per_epoch = steps_per_epoch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _my_files(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        files = list(self.files)
        random.Random(self.seed + self.epoch).shuffle(files)
        slot, slots = self.rank * nw + wid, self.world * nw
        return files[slot::slots] or files[self.rank % len(files)::len(files)]

    def _records(self):
        for path in itertools.cycle(self._my_files()):
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    row = json.loads(line)
                    yield hash_tokens(row["text"]), int(row["intent"])

    def __iter__(self):
        info = get_worker_info()
        nw = info.num_workers if info else 1
        return itertools.islice(self._records(), self.steps_per_epoch // nw)


def pad_batch(rows):
    toks, labels = zip(*rows)
    x = torch.zeros(len(toks), MAX_LEN, dtype=torch.long)
    for i, t in enumerate(toks):
        x[i, :len(t)] = torch.tensor(t, dtype=torch.long)
    return x, torch.tensor(labels)


class BagClassifier(nn.Module):
    def __init__(self, dim=300):
        super().__init__()
        self.emb = nn.EmbeddingBag(VOCAB, dim, mode="mean", padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(dim, 512), nn.ReLU(), nn.Dropout(0.3), nn.Linear(512, N_INTENTS))

    def forward(self, x):
        return self.mlp(self.emb(x))


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    ds = JsonlShards("data/intents/train-*.jsonl", rank, world, steps_per_epoch=64 * 2000, seed=17)
    loader = DataLoader(ds, batch_size=64, num_workers=4, collate_fn=pad_batch, pin_memory=True)
    model = DDP(BagClassifier().to(device), device_ids=[local_rank])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(10):
        ds.set_epoch(epoch)
        model.train()
        meter = torch.zeros(3, device=device)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            meter += torch.stack([loss.detach() * y.numel(), (logits.argmax(1) == y).sum().float(),
                                  torch.tensor(float(y.numel()), device=device)])
        dist.all_reduce(meter)
        if rank == 0:
            print(f"epoch {epoch}: loss {(meter[0] / meter[2]).item():.4f} acc {(meter[1] / meter[2]).item():.4f}")
            torch.save(model.module.state_dict(), "intent_bag.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
