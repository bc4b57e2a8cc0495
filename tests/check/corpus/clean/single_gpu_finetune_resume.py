"""Single-GPU transfer-learning shape: resume from a checkpoint loaded under torch.serialization.safe_globals, patience-based stopping."""
import argparse
import os

import torch
import torch.nn as nn
import torchvision
from torchvision import transforms


def build_model(num_classes):
    model = torchvision.models.efficientnet_b0(weights="IMAGENET1K_V1")
    model.classifier[1] = nn.Linear(model.classifier[1].in_features, num_classes)
    return model


def run_epoch(model, loader, device, criterion, optimizer=None):
    train = optimizer is not None
    model.train(train)
    loss_sum, correct, n = 0.0, 0, 0
    with torch.set_grad_enabled(train):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
                loss = criterion(out, y)
            if train:
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            loss_sum += loss.item() * y.size(0)
            correct += (out.argmax(1) == y).sum().item()
            n += y.size(0)
    return loss_sum / n, correct / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--patience", type=int, default=5)
    ap.add_argument("--ckpt", default="finetune_last.pt")
    args = ap.parse_args()
    device = torch.device("cuda:0")
    tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()])
    train_ds = torchvision.datasets.ImageFolder(os.path.join(args.data, "train"), tf)
    val_ds = torchvision.datasets.ImageFolder(os.path.join(args.data, "val"), tf)
    train_loader = torch.utils.data.DataLoader(train_ds, batch_size=64, shuffle=True, num_workers=8)
    val_loader = torch.utils.data.DataLoader(val_ds, batch_size=128, num_workers=8)

    model = build_model(len(train_ds.classes)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    criterion = nn.CrossEntropyLoss()
    start, best, stale = 0, 0.0, 0
    if os.path.exists(args.ckpt):
        with torch.serialization.safe_globals([argparse.Namespace]):
            ckpt = torch.load(args.ckpt, map_location=device)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start, best, stale = ckpt["epoch"] + 1, ckpt["best"], ckpt["stale"]
        print(f"resumed from epoch {ckpt['epoch']} (args were {ckpt['args']})")
    for epoch in range(start, args.epochs):
        tr_loss, tr_acc = run_epoch(model, train_loader, device, criterion, optimizer)
        va_loss, va_acc = run_epoch(model, val_loader, device, criterion)
        print(f"{epoch}: train {tr_loss:.3f}/{tr_acc:.3f} val {va_loss:.3f}/{va_acc:.3f}")
        if va_acc > best:
            best, stale = va_acc, 0
            torch.save(model.state_dict(), "finetune_best.pt")
        else:
            stale += 1
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                    "best": best, "stale": stale, "args": args}, args.ckpt)
        if stale >= args.patience:
            print("no improvement, stopping")
            break


if __name__ == "__main__":
    main()
