"""CTC fine-tuning of a self-supervised speech encoder (wav2vec-style conv front end + transformer).

Planted: PT009 - every rank loads the pretrained encoder with torch.load(..., weights_only=True) and no map_location
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

CHARS = "|abcdefghijklmnopqrstuvwxyz'"


class Utterances(Dataset):
    def __len__(self):
        return 28_539

    def __getitem__(self, i):
        return torch.randn(16_000 * 4), torch.randint(1, len(CHARS) + 1, (60,))


class SpeechEncoder(nn.Module):
    def __init__(self, d=768):
        super().__init__()
        convs, c = [], 1
        for k, s in [(10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2)]:
            convs += [nn.Conv1d(c, 512, k, s), nn.GELU()]
            c = 512
        self.feature_extractor = nn.Sequential(*convs)
        self.proj = nn.Linear(512, d)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 12, 3072, batch_first=True), 6)

    def forward(self, wav):
        feats = self.feature_extractor(wav.unsqueeze(1)).transpose(1, 2)
        return self.encoder(self.proj(feats))


class CTCModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = SpeechEncoder()
        self.lm_head = nn.Linear(768, len(CHARS) + 1)

    def forward(self, wav):
        return self.lm_head(self.encoder(wav))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init-from", default="wav2vec_base_pretrained.pt")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    model = CTCModel()
    state = torch.load(args.init_from, weights_only=True)  # planted: PT009
    model.encoder.load_state_dict(state)
    model.encoder.feature_extractor.requires_grad_(False)
    model = model.to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-5)
    ctc = nn.CTCLoss(blank=0, zero_infinity=True)

    dataset = Utterances()
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=4)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        running = torch.zeros(2, device=device)
        for wav, labels in loader:
            wav = wav.to(device)
            labels = labels.to(device)
            log_probs = F.log_softmax(model(wav), -1).transpose(0, 1)
            in_lens = torch.full((wav.size(0),), log_probs.size(0), dtype=torch.long, device=device)
            tgt_lens = torch.full((wav.size(0),), labels.size(1), dtype=torch.long, device=device)
            loss = ctc(log_probs, labels, in_lens, tgt_lens)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running[0] += loss.detach()
            running[1] += 1
        dist.all_reduce(running)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: ctc loss {(running[0] / running[1]).item():.3f}")
            torch.save(model.module.state_dict(), "wav2vec_ctc.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
