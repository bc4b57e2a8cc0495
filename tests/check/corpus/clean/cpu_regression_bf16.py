"""CPU-only shape: tabular regression with bf16 CPU autocast (no scaler), early stopping on validation loss, prints everywhere."""
import copy

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset, random_split


def make_data(n=50000, d=24, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=(d, 1)).astype(np.float32)
    y = np.sin(X @ w) + 0.05 * rng.normal(size=(n, 1)).astype(np.float32)
    return TensorDataset(torch.from_numpy(X), torch.from_numpy(y))


def evaluate(model, loader):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        for x, y in loader:
            total += nn.functional.mse_loss(model(x).float(), y, reduction="sum").item()
            count += y.numel()
    return total / count


def main(epochs=200, patience=8):
    torch.manual_seed(0)
    data = make_data()
    train_set, val_set = random_split(data, [45000, 5000])
    train_loader = DataLoader(train_set, batch_size=512, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=2048)
    model = nn.Sequential(nn.Linear(24, 128), nn.SiLU(), nn.Linear(128, 128), nn.SiLU(), nn.Linear(128, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    best_loss, best_state, waited = float("inf"), None, 0
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                pred = model(x)
            loss = nn.functional.mse_loss(pred.float(), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        val_loss = evaluate(model, val_loader)
        print(f"epoch {epoch:3d} val_mse {val_loss:.5f}")
        if val_loss < best_loss - 1e-5:
            best_loss, best_state, waited = val_loss, copy.deepcopy(model.state_dict()), 0
        else:
            waited += 1
            if waited >= patience:
                print(f"early stop at epoch {epoch}")
                break
    model.load_state_dict(best_state)
    torch.save(model.state_dict(), "regressor_cpu.pt")


if __name__ == "__main__":
    main()
