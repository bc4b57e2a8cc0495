"""CRNN + CTC text-line recognition trained on every GPU of one machine.

Planted: PT014 - the model is wrapped in nn.DataParallel
"""
import argparse
import logging
import string

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import transforms
from torchvision.datasets import ImageFolder

ALPHABET = string.digits + string.ascii_lowercase
logger = logging.getLogger("crnn")


class CRNN(nn.Module):
    def __init__(self, num_classes=len(ALPHABET) + 1, hidden=256):
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(1, 64, 3, 1, 1), nn.ReLU(True), nn.MaxPool2d(2, 2),
            nn.Conv2d(64, 128, 3, 1, 1), nn.ReLU(True), nn.MaxPool2d(2, 2),
            nn.Conv2d(128, 256, 3, 1, 1), nn.BatchNorm2d(256), nn.ReLU(True),
            nn.MaxPool2d((2, 1), (2, 1)),
            nn.Conv2d(256, 256, 3, 1, 1), nn.BatchNorm2d(256), nn.ReLU(True),
            nn.AdaptiveAvgPool2d((1, None)),
        )
        self.rnn = nn.LSTM(256, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(hidden * 2, num_classes)

    def forward(self, x):
        feats = self.cnn(x).squeeze(2).permute(0, 2, 1)
        out, _ = self.rnn(feats)
        return self.fc(out).log_softmax(-1)


def encode(words):
    targets = [torch.tensor([ALPHABET.index(c) + 1 for c in w.lower() if c in ALPHABET]) for w in words]
    lengths = torch.tensor([len(t) for t in targets])
    return torch.cat(targets), lengths


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-dir", default="synth90k/train")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    tf = transforms.Compose([transforms.Grayscale(), transforms.Resize((32, 128)), transforms.ToTensor()])
    data = ImageFolder(args.train_dir, transform=tf)
    words = data.classes
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=8, drop_last=True)

    model = CRNN().cuda()
    model = nn.DataParallel(model)  # planted: PT014
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    ctc = nn.CTCLoss(blank=0, zero_infinity=True)

    for epoch in range(args.epochs):
        for step, (images, label_ids) in enumerate(loader):
            images = images.cuda(non_blocking=True)
            targets, target_lengths = encode([words[i] for i in label_ids.tolist()])
            log_probs = model(images).permute(1, 0, 2)
            input_lengths = torch.full((images.size(0),), log_probs.size(0), dtype=torch.long)
            loss = ctc(log_probs, targets, input_lengths, target_lengths)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            if step % 200 == 0:
                logger.info("epoch %d step %d ctc %.4f", epoch, step, loss.item())

    torch.save(model.module.state_dict(), "crnn_synth90k.pt")


if __name__ == "__main__":
    main()
