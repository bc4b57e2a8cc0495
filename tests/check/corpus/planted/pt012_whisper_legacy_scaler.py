"""Speech-to-text fine-tuning (encoder-decoder, teacher forcing) with fp16 mixed precision.

Planted: PT012 - the GradScaler comes from `from torch.cuda import amp` (deprecated torch.cuda.amp.GradScaler)
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.cuda import amp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

PAD_ID = 0


class LogMelDataset(Dataset):
    def __init__(self, n=2000, frames=300, n_mels=80, max_tokens=40, vocab=500):
        self.feats = torch.randn(n, frames, n_mels)
        self.labels = torch.randint(1, vocab, (n, max_tokens))

    def __len__(self):
        return len(self.feats)

    def __getitem__(self, idx):
        return {"input_features": self.feats[idx], "labels": self.labels[idx]}


class Seq2Seq(nn.Module):
    def __init__(self, n_mels=80, d_model=256, vocab=500):
        super().__init__()
        self.proj = nn.Linear(n_mels, d_model)
        self.embed = nn.Embedding(vocab, d_model)
        self.transformer = nn.Transformer(d_model, nhead=4, num_encoder_layers=2,
                                          num_decoder_layers=2, batch_first=True)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, feats, decoder_ids):
        mask = self.transformer.generate_square_subsequent_mask(decoder_ids.size(1)).to(feats.device)
        hidden = self.transformer(self.proj(feats), self.embed(decoder_ids), tgt_mask=mask)
        return self.head(hidden)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--output_dir", default="whisper-ft")
    return p.parse_args()


def main():
    args = parse_args()
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}")
    is_main = dist.get_rank() == 0

    train_set = LogMelDataset()
    sampler = DistributedSampler(train_set, seed=42)
    loader = DataLoader(train_set, batch_size=16, sampler=sampler, num_workers=2, pin_memory=True)

    model = DDP(Seq2Seq().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss(ignore_index=PAD_ID)
    scaler = amp.GradScaler(enabled=args.fp16)  # planted: PT012

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for step, batch in enumerate(loader):
            feats = batch["input_features"].to(device, non_blocking=True)
            labels = batch["labels"].to(device, non_blocking=True)
            decoder_in, targets = labels[:, :-1], labels[:, 1:]
            with torch.autocast("cuda", dtype=torch.float16, enabled=args.fp16):
                logits = model(feats, decoder_in)
                loss = criterion(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            if is_main and step % 100 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} scale {scaler.get_scale():.0f}")

        if is_main:
            os.makedirs(args.output_dir, exist_ok=True)
            torch.save(model.module.state_dict(), os.path.join(args.output_dir, "model.pt"))

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
