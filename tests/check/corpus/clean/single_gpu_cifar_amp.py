"""Single-GPU CIFAR shape: fp16 torch.autocast with torch.amp.GradScaler, cosine schedule, plain prints and state_dict save."""
import argparse
import time

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T


def get_loaders(root, batch_size):
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])
    test_tf = T.Compose([T.ToTensor(), T.Normalize(mean, std)])
    train = torchvision.datasets.CIFAR10(root, train=True, download=True, transform=train_tf)
    test = torchvision.datasets.CIFAR10(root, train=False, download=True, transform=test_tf)
    return (torch.utils.data.DataLoader(train, batch_size=batch_size, shuffle=True, num_workers=4, pin_memory=True),
            torch.utils.data.DataLoader(test, batch_size=512, shuffle=False, num_workers=4))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="./data")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    device = torch.device("cuda")
    train_loader, test_loader = get_loaders(args.root, args.batch_size)
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    scaler = torch.amp.GradScaler("cuda")
    criterion = nn.CrossEntropyLoss()
    best = 0.0
    for epoch in range(args.epochs):
        model.train()
        t0 = time.time()
        for inputs, targets in train_loader:
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                loss = criterion(model(inputs), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        scheduler.step()
        model.eval()
        correct = total = 0
        with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.float16):
            for inputs, targets in test_loader:
                inputs, targets = inputs.to(device), targets.to(device)
                correct += (model(inputs).argmax(1) == targets).sum().item()
                total += targets.size(0)
        acc = correct / total
        print(f"epoch {epoch}: acc {acc:.4f} ({time.time() - t0:.1f}s)")
        if acc > best:
            best = acc
            torch.save({"model": model.state_dict(), "acc": acc, "epoch": epoch}, "cifar_best.pt")
    print(f"best accuracy {best:.4f}")


if __name__ == "__main__":
    main()
