# ruff: noqa: B007
"""Seed 000, "推荐工作流整合" (the recommended workflow): nn.DataParallel with AMP, saving the
weights without the ``module.`` prefix. Written for GPUs; without one it trains in one CPU
process with AMP disabled (and warnings saying so). The port is dataparallel_paratrain.py.

The tutorial uses MyModel, train_loader, criterion, optimizer, scaler and epochs without
defining them; the lines marked "not in the tutorial" fill them in (the loader line is the one
the same tutorial gives in its section on host memory).
"""

import torch
import torch.nn as nn
from standins import MyModel, teacher_dataset  # not in the tutorial: its undefined model, data
from torch.utils.data import DataLoader

# 1. Device setup
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# 2. Build the model
model = MyModel()
criterion = nn.CrossEntropyLoss()  # not in the tutorial
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # not in the tutorial
scaler = torch.cuda.amp.GradScaler()  # not in the tutorial; its AMP section makes it so
dataset = teacher_dataset(4096, (1, 8, 8))  # not in the tutorial
train_loader = DataLoader(dataset, batch_size=64, pin_memory=False)
epochs = 10  # not in the tutorial

# 3. Multi-GPU wrapping (optional)
if torch.cuda.device_count() > 1:
    model = nn.DataParallel(model, device_ids=[0, 1])  # the GPU list can be chosen
model.to(device)

# 4. Training loop
for epoch in range(epochs):
    for data, target in train_loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        with torch.cuda.amp.autocast():
            output = model(data)
            loss = criterion(output, target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

# 5. Save the model (strip the module wrapper)
save_path = "trained_model.pth"
if isinstance(model, torch.nn.DataParallel):
    torch.save(model.module.state_dict(), save_path)
else:
    torch.save(model.state_dict(), save_path)
print(f"Model saved to {save_path}")
