"""Image captioning (CNN encoder + GRU decoder with teacher forcing) trained with DDP.

Planted: PT006 - rank 0 saves the DDP wrapper's state_dict (keys get a `module.` prefix)
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

VOCAB_SIZE = 10_000
MAX_LEN = 20


class CaptionPairs(Dataset):
    def __len__(self):
        return 400_000

    def __getitem__(self, i):
        return torch.rand(3, 224, 224), torch.randint(1, VOCAB_SIZE, (MAX_LEN,))


class Captioner(nn.Module):
    def __init__(self, embed=256, hidden=512):
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv2d(3, 64, 7, 4, 3), nn.ReLU(), nn.Conv2d(64, 256, 3, 2, 1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, hidden))
        self.embed = nn.Embedding(VOCAB_SIZE, embed)
        self.gru = nn.GRU(embed, hidden, batch_first=True)
        self.out = nn.Linear(hidden, VOCAB_SIZE)

    def forward(self, images, captions):
        h0 = torch.tanh(self.cnn(images)).unsqueeze(0)
        out, _ = self.gru(self.embed(captions[:, :-1]), h0)
        return self.out(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--checkpoint", default="captioner.pt")
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    model = Captioner().to(device)
    model = DDP(model, device_ids=[local_rank], output_device=local_rank)
    optimizer = torch.optim.Adam(model.parameters(), lr=4e-4)

    dataset = CaptionPairs()
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=8, pin_memory=True)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        total_loss = torch.zeros(1, device=device)
        total_tokens = torch.zeros(1, device=device)
        for images, captions in loader:
            images = images.to(device)
            captions = captions.to(device)
            logits = model(images, captions)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), captions[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            total_loss += loss.detach() * captions[:, 1:].numel()
            total_tokens += captions[:, 1:].numel()
        dist.all_reduce(total_loss)
        dist.all_reduce(total_tokens)
        if dist.get_rank() == 0:
            print(f"epoch {epoch} | loss {(total_loss / total_tokens).item():.4f}")
            torch.save(model.state_dict(), args.checkpoint)  # planted: PT006

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
