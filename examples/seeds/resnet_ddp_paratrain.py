"""resnet_ddp_original.py on paratrain: the GPU picked by local rank, the epoch loss averaged
over ranks, a checkpoint every epoch and the trained weights saved. Without torchvision it uses
TinyResNet from standins.py; without the ImageNet folder, generated images (never a download).

    python resnet_ddp_paratrain.py --epochs 2 --samples 256 --image-size 32 --classes 10
    paratrain run --nproc 2 resnet_ddp_paratrain.py --epochs 2 --samples 256 --image-size 32 \
        --classes 10 --batch-size 16
    paratrain run --nproc 4 resnet_ddp_paratrain.py --data /data/imagenet   # the real thing
"""

import argparse
import os

import torch.nn as nn
import torch.optim as optim
from standins import TinyResNet, synthetic_images

import paratrain as pt

try:
    from torchvision import datasets, models, transforms
except Exception as error:  # not installed, or built for another torch (fails at import)
    datasets = models = transforms = None
    torchvision_error = f"{type(error).__name__}: {error}"

parser = argparse.ArgumentParser(description="ResNet-50 DDP tutorial, ported")
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=64, help="per-rank batch")
parser.add_argument("--data", default="/path/to/imagenet", help="ImageNet folder, if any")
parser.add_argument("--samples", type=int, default=2048, help="generated images (no --data)")
parser.add_argument("--image-size", type=int, default=224, help="generated images (no --data)")
parser.add_argument("--classes", type=int, default=1000)
parser.add_argument("--arch", choices=["resnet50", "tiny"], default="resnet50")
parser.add_argument("--run-dir", default=None, help="default: paratrain run's, or runs/paratrain")
args = parser.parse_args()

# Initialise the distributed environment
# (rank, local rank, world size from the launcher; device cuda:<local rank>, or the CPU)
run = pt.Run(run_dir=args.run_dir, progress=False)

# Load the dataset: ImageNet where the folder is there and torchvision imports
if datasets is not None and os.path.isdir(args.data):
    # Data preprocessing
    transform = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    dataset = datasets.ImageNet(args.data, transform=transform)
else:
    why = "no torchvision" if datasets is None else f"no folder {args.data}"
    run.print(f"data: {args.samples} generated {args.image_size}px images ({why})")
    dataset = synthetic_images(args.samples, args.image_size, args.classes)
dataloader = run.loader(dataset, batch_size=args.batch_size)

# Build the model
if models is not None and args.arch == "resnet50":
    run.print("model: torchvision resnet50")
    model = models.resnet50(weights=None)
else:
    why = "--arch tiny" if args.arch == "tiny" else f"torchvision: {torchvision_error}"
    run.print(f"model: TinyResNet from standins.py ({why})")
    model = TinyResNet()
model.fc = nn.Linear(model.fc.in_features, args.classes)
ddp_model = run.setup(model)

# Loss function and optimizer
criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

# Training loop
for epoch in run.epochs(args.epochs):
    running_loss = 0.0
    for inputs, labels in dataloader:
        outputs = ddp_model(inputs)
        loss = criterion(outputs, labels)
        run.backward(loss)
        run.step(optimizer)
        running_loss += loss.item()
    run.save()
    epoch_loss = run.reduce(running_loss / len(dataloader), "mean")
    run.log({"loss": epoch_loss})
    run.print(f"Epoch {epoch + 1}, Loss: {epoch_loss:.4f}")

run.save_weights(ddp_model, run.run_dir / "resnet.pth")
run.close()
