"""Character-level LSTM language model; batches come from generators."""
import os
from typing import Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SEQ = 256


class CharChunks(Dataset):
    def __init__(self, text: str):
        self.vocab = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.vocab)}
        self.data = torch.tensor([self.stoi[c] for c in text], dtype=torch.long)

    def __len__(self):
        return (len(self.data) - 1) // SEQ

    def __getitem__(self, i):
        chunk = self.data[i * SEQ: (i + 1) * SEQ + 1]
        return chunk[:-1], chunk[1:]


def on_device(loader, device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for x, y in loader:
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def epochs(loader, sampler, n_epochs, device):
    for epoch in range(n_epochs):
        sampler.set_epoch(epoch)
        yield epoch, on_device(loader, device)


def all_steps(loader, sampler, n_epochs, device):
    for epoch, batches in epochs(loader, sampler, n_epochs, device):
        yield from ((epoch, x, y) for x, y in batches)


class CharLSTM(nn.Module):
    def __init__(self, vocab, dim=512, layers=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, layers, batch_first=True, dropout=0.2)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        return self.head(self.rnn(self.emb(x))[0])


def main():
    dist.init_process_group("nccl")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    rank0 = dist.get_rank() == 0

    with open(os.environ.get("CORPUS", "input.txt"), encoding="utf-8") as fh:
        ds = CharChunks(fh.read())
    sampler = DistributedSampler(ds, seed=7)
    loader = DataLoader(ds, batch_size=64, sampler=sampler, drop_last=True)
    net = CharLSTM(len(ds.vocab)).to(device)
    model = DDP(net, device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)

    window = torch.zeros(2, device=device)
    last_epoch = -1
    for step, (epoch, x, y) in enumerate(all_steps(loader, sampler, 20, device)):
        if epoch != last_epoch and rank0:
            print(f"--- epoch {epoch} ---")
        last_epoch = epoch
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        window += torch.stack([loss.detach(), torch.ones((), device=device)])
        if (step + 1) % 200 == 0:
            dist.all_reduce(window)
            if rank0:
                print(f"step {step + 1}: bpc {(window[0] / window[1]).item() / 0.6931:.3f}")
                torch.save({"vocab": ds.vocab, "model": net.state_dict()}, "charlm.pt")
            window.zero_()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
