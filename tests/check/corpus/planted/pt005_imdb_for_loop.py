"""IMDB sentiment LSTM trained with DDP (torchrun), the epoch loop written inline in main().

Planted: PT005 - the epoch loop never calls train_sampler.set_epoch(epoch); every epoch sees the same order.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from text_data import IMDBDataset, build_vocab


class LSTMClassifier(nn.Module):
    def __init__(self, vocab_size, embed_dim=128, hidden=256):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.lstm = nn.LSTM(embed_dim, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, 2)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out.mean(dim=1))


def collate(batch):
    tokens = pad_sequence([torch.tensor(t) for t, _ in batch], batch_first=True)
    labels = torch.tensor([y for _, y in batch])
    return tokens, labels


def main(epochs=5, batch_size=64):
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    vocab = build_vocab("data/imdb")
    train_set = IMDBDataset("data/imdb", "train", vocab)
    test_set = IMDBDataset("data/imdb", "test", vocab)
    train_sampler = DistributedSampler(train_set)
    test_sampler = DistributedSampler(test_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=train_sampler, collate_fn=collate)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler, collate_fn=collate)

    model = DDP(LSTMClassifier(len(vocab)).to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(epochs):  # planted: PT005
        model.train()
        for tokens, labels in train_loader:
            tokens, labels = tokens.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = criterion(model(tokens), labels)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()

        model.eval()
        hits = torch.zeros(2, device=device)
        with torch.no_grad():
            for tokens, labels in test_loader:
                tokens, labels = tokens.to(device), labels.to(device)
                hits[0] += (model(tokens).argmax(-1) == labels).sum()
                hits[1] += labels.numel()
        dist.all_reduce(hits)
        if rank == 0:
            print(f"epoch {epoch}: test accuracy {(hits[0] / hits[1]).item():.4f}")
            torch.save(model.module.state_dict(), "imdb_lstm.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
