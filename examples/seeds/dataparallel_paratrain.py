"""dataparallel_original.py on paratrain: one process per GPU instead of nn.DataParallel's
threads, the same global batch, AMP and unprefixed weights without code for either.

    python dataparallel_paratrain.py                                  # one process
    paratrain run --nproc 2 dataparallel_paratrain.py --epochs 3      # 2 ranks (gloo on CPU)
"""

import argparse

import torch
import torch.nn as nn
from standins import MyModel, teacher_dataset  # not in the tutorial: its undefined model, data

import paratrain as pt

parser = argparse.ArgumentParser(description="DataParallel tutorial, ported")
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--samples", type=int, default=4096)
parser.add_argument("--batch-size", type=int, default=64, help="global batch, as DataParallel's")
parser.add_argument("--precision", default="fp16" if torch.cuda.is_available() else "fp32")
parser.add_argument("--run-dir", default=None, help="default: paratrain run's, or runs/paratrain")
args = parser.parse_args()

# 1. Device setup
# one rank per GPU (cuda:<local rank>) or the CPU; precision="fp16" brings autocast and scaler
run = pt.Run(precision=args.precision, global_batch=args.batch_size, run_dir=args.run_dir)

# 2. Build the model
model = MyModel()
criterion = nn.CrossEntropyLoss()  # not in the tutorial
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # not in the tutorial
dataset = teacher_dataset(args.samples, (1, 8, 8))  # not in the tutorial
per_rank_batch = args.batch_size // run.world_size  # global_batch fails if it does not divide
train_loader = run.loader(dataset, batch_size=per_rank_batch, shuffle=False)
epochs = args.epochs

# 3. Multi-GPU wrapping: DDP over the ranks of `paratrain run` (nothing to wrap in one process)
model, optimizer = run.setup(model, optimizer)

# 4. Training loop
for epoch in run.epochs(epochs):
    for data, target in train_loader:
        output = model(data)
        loss = criterion(output, target)
        run.backward(loss)
        run.step(optimizer)
    run.save()
    epoch_loss = run.reduce(loss.detach(), "mean").item()
    run.log({"loss": epoch_loss})
    run.print(f"Epoch {epoch}, loss {epoch_loss:.4f} (last batch, mean over ranks)")

# 5. Save the model (strip the module wrapper)
save_path = run.run_dir / "trained_model.pth"
run.save_weights(model, save_path)
run.print(f"Model saved to {save_path}")
run.close()
