import math
import os
from functools import cached_property

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

PAD, BOS, EOS, VOCAB = 0, 1, 2, 8000


class DistEnv:
    """Reads the torchrun environment once."""

    @cached_property
    def rank(self) -> int:
        return int(os.environ.get("RANK", "0"))

    @cached_property
    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    @cached_property
    def world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", "1"))

    @cached_property
    def device(self) -> torch.device:
        return torch.device("cuda", self.local_rank)

    @cached_property
    def leader(self) -> bool:
        return self.rank == 0

    def start(self):
        torch.cuda.set_device(self.device)
        dist.init_process_group("nccl", rank=self.rank, world_size=self.world_size)


class Bitext(Dataset):
    def __init__(self, n=50_000, max_len=40):
        self.n, self.max_len = n, max_len

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ls, lt = torch.randint(5, self.max_len, (2,), generator=g).tolist()
        src = torch.randint(3, VOCAB, (ls,), generator=g)
        tgt = torch.cat([torch.tensor([BOS]), torch.randint(3, VOCAB, (lt,), generator=g), torch.tensor([EOS])])
        return src, tgt


def collate(batch):
    srcs, tgts = zip(*batch)
    pad = nn.utils.rnn.pad_sequence
    return pad(srcs, batch_first=True, padding_value=PAD), pad(tgts, batch_first=True, padding_value=PAD)


class Translator(nn.Module):
    def __init__(self, d=512):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d, padding_idx=PAD)
        self.pos = nn.Embedding(256, d)
        self.tf = nn.Transformer(d, 8, 6, 6, 2048, 0.1, batch_first=True)
        self.proj = nn.Linear(d, VOCAB)
        self.d = d

    def embed(self, x):
        pos = torch.arange(x.size(1), device=x.device)
        return self.emb(x) * math.sqrt(self.d) + self.pos(pos)

    def forward(self, src, tgt_in):
        causal = self.tf.generate_square_subsequent_mask(tgt_in.size(1), device=src.device)
        h = self.tf(self.embed(src), self.embed(tgt_in), tgt_mask=causal,
                    src_key_padding_mask=src.eq(PAD), tgt_key_padding_mask=tgt_in.eq(PAD))
        return self.proj(h)


def inverse_sqrt(step, warmup=4000):
    step = max(step, 1)
    return min(step ** -0.5, step * warmup ** -1.5) * warmup ** 0.5


def main():
    env = DistEnv()
    env.start()
    ds = Bitext()
    sampler = DistributedSampler(ds, num_replicas=env.world_size, rank=env.rank)
    loader = DataLoader(ds, batch_size=64, sampler=sampler, collate_fn=collate, num_workers=2)
    model = DDP(Translator().to(env.device), device_ids=[env.local_rank])
    opt = torch.optim.Adam(model.parameters(), lr=7e-4, betas=(0.9, 0.98), eps=1e-9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, inverse_sqrt)
    crit = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1, reduction="sum")

    for epoch in range(30):
        sampler.set_epoch(epoch)
        tot = torch.zeros(2, device=env.device)
        for src, tgt in loader:
            src, tgt = src.to(env.device), tgt.to(env.device)
            logits = model(src, tgt[:, :-1])
            ntok = tgt[:, 1:].ne(PAD).sum()
            loss_sum = crit(logits.reshape(-1, VOCAB), tgt[:, 1:].reshape(-1))
            opt.zero_grad()
            (loss_sum / ntok).backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            tot[0] += loss_sum.detach()
            tot[1] += ntok
        dist.all_reduce(tot)
        if env.leader:
            nll = (tot[0] / tot[1]).item()
            print(f"epoch {epoch}: token nll {nll:.3f} ppl {math.exp(nll):.1f}")
            torch.save(model.module.state_dict(), f"translator_ep{epoch}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
