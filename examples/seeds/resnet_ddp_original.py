"""Seed 002, section 7, "实战案例:多卡训练ResNet-50图像分类模型" (case study: ResNet-50
image classification on several GPUs), started with ``torchrun --nproc_per_node=4``. Needs
CUDA (nccl), torchvision and ImageNet under /path/to/imagenet; the port is
resnet_ddp_paratrain.py. Complete as the tutorial gives it but for one missing import.
"""

import torch
import torch.distributed as dist  # missing in the tutorial, which calls dist.init_process_group
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, models, transforms

# Initialise the distributed environment
dist.init_process_group(backend="nccl")
local_rank = dist.get_rank()
torch.cuda.set_device(local_rank)

# Data preprocessing
transform = transforms.Compose(
    [
        transforms.Resize(256),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ]
)

# Load the dataset
dataset = datasets.ImageNet("/path/to/imagenet", transform=transform)
sampler = DistributedSampler(dataset)
dataloader = torch.utils.data.DataLoader(
    dataset, batch_size=64, sampler=sampler, num_workers=4, pin_memory=True
)

# Build the model
model = models.resnet50(pretrained=False)
model.fc = nn.Linear(model.fc.in_features, 1000)
model = model.to(local_rank)
ddp_model = DDP(model, device_ids=[local_rank])

# Loss function and optimizer
criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

# Training loop
for epoch in range(10):
    sampler.set_epoch(epoch)
    running_loss = 0.0
    for inputs, labels in dataloader:
        inputs, labels = inputs.to(local_rank), labels.to(local_rank)
        optimizer.zero_grad()
        outputs = ddp_model(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()
        running_loss += loss.item()
    if local_rank == 0:
        print(f"Epoch {epoch + 1}, Loss: {running_loss / len(dataloader):.4f}")
