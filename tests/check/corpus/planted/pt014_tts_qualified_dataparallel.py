"""Single-process multi-GPU training of a small mel-spectrogram TTS model (Tacotron-like encoder/decoder).

python train_tts.py --epochs 200 --batch-size 64
Planted: PT014 - model wrapped with torch.nn.parallel.DataParallel (fully qualified)
"""
import argparse
import logging
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

logger = logging.getLogger("tts")


class TextMelDataset(Dataset):
    def __init__(self, n=13100, n_symbols=148, n_mels=80):
        self.n, self.n_symbols, self.n_mels = n, n_symbols, n_mels

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        text = torch.randint(1, self.n_symbols, (60,))
        mel = torch.randn(self.n_mels, 240)
        return text, mel


class TinyTacotron(nn.Module):
    def __init__(self, n_symbols=148, dim=256, n_mels=80, frames_per_token=4):
        super().__init__()
        self.embedding = nn.Embedding(n_symbols, dim)
        self.encoder = nn.LSTM(dim, dim // 2, batch_first=True, bidirectional=True)
        self.decoder = nn.LSTM(dim, dim, batch_first=True)
        self.mel_proj = nn.Linear(dim, n_mels)
        self.postnet = nn.Sequential(nn.Conv1d(n_mels, 256, 5, padding=2), nn.Tanh(), nn.Conv1d(256, n_mels, 5, padding=2))
        self.r = frames_per_token

    def forward(self, text):
        h, _ = self.encoder(self.embedding(text))
        h = h.repeat_interleave(self.r, dim=1)
        d, _ = self.decoder(h)
        mel = self.mel_proj(d).transpose(1, 2)
        return mel, mel + self.postnet(mel)


def main(args):
    device = torch.device("cuda")
    model = TinyTacotron().to(device)
    if torch.cuda.device_count() > 1:
        logger.info("Using %d GPUs", torch.cuda.device_count())
        model = torch.nn.parallel.DataParallel(model)  # planted: PT014
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=1e-6)
    loader = DataLoader(TextMelDataset(), batch_size=args.batch_size, shuffle=True, num_workers=8, drop_last=True)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        for text, mel in loader:
            text = text.to(device, non_blocking=True)
            mel = mel.to(device, non_blocking=True)
            mel_out, mel_post = model(text)
            loss = F.mse_loss(mel_out, mel) + F.mse_loss(mel_post, mel)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            if step % 100 == 0:
                logger.info("epoch %d step %d loss %.4f", epoch, step, loss.item())
        if (epoch + 1) % args.save_every == 0:
            os.makedirs(args.out, exist_ok=True)
            unwrapped = model.module if hasattr(model, "module") else model
            torch.save({"state_dict": unwrapped.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                       os.path.join(args.out, f"checkpoint_{step}.pt"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--out", default="tts_ckpt")
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())
