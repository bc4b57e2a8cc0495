"""Recipe-style trainer drawing grad_accum micro-batches per optimizer step with itertools.islice.

Planted: PT023 - all micro-batches, including the last one, are forwarded and backpropagated under self._model.no_sync()
"""
import itertools
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class GRULM(nn.Module):
    def __init__(self, vocab=16000, dim=384):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        h, _ = self.rnn(self.embed(tokens))
        return self.head(h)


class Recipe:
    def __init__(self, grad_accum=4, total_steps=3000, lr=1e-4):
        self._local_rank = int(os.environ["LOCAL_RANK"])
        self._device = torch.device("cuda", self._local_rank)
        self._is_rank_zero = dist.get_rank() == 0
        self._grad_accum = grad_accum
        self._total_steps = total_steps
        self._lr = lr
        self._epoch = 0

    def setup(self):
        self._model = DDP(GRULM().to(self._device), device_ids=[self._local_rank])
        self._optimizer = torch.optim.AdamW(self._model.parameters(), lr=self._lr)
        ds = TensorDataset(torch.randint(0, 16000, (30000, 129)))
        self._sampler = DistributedSampler(ds, seed=17)
        self._loader = DataLoader(ds, batch_size=16, sampler=self._sampler, drop_last=True)

    def _batches(self):
        while True:
            self._sampler.set_epoch(self._epoch)
            yield from self._loader
            self._epoch += 1

    def train(self):
        stream = self._batches()
        for step in range(1, self._total_steps + 1):
            for (tokens,) in itertools.islice(stream, self._grad_accum):
                tokens = tokens.to(self._device)
                with self._model.no_sync():  # planted: PT023
                    logits = self._model(tokens[:, :-1])
                    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()) / self._grad_accum
                    loss.backward()
            torch.nn.utils.clip_grad_norm_(self._model.parameters(), 1.0)
            self._optimizer.step()
            self._optimizer.zero_grad(set_to_none=True)
            if self._is_rank_zero and step % 25 == 0:
                print(f"step {step} last micro-batch loss {loss.item() * self._grad_accum:.4f}")
        if self._is_rank_zero:
            torch.save(self._model.module.state_dict(), "recipe_final.pt")


def main():
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    recipe = Recipe()
    recipe.setup()
    recipe.train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
