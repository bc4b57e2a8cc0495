"""torchrun_template_original.py on paratrain: the GPU picked by local rank (not the global
rank), a new shuffle every epoch, the global batch printed, metrics summed over ranks, and
checkpoints that a restart under ``paratrain run --max-restarts`` resumes from.

    python torchrun_template_paratrain.py                                    # one process
    paratrain run --nproc 2 torchrun_template_paratrain.py --epochs 3        # 2 ranks
    torchrun --nproc_per_node=2 torchrun_template_paratrain.py               # also works
"""

import argparse

import torch
from standins import teacher_dataset  # not in the tutorial: generated data

import paratrain as pt

parser = argparse.ArgumentParser(description="torchrun template, ported")
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--samples", type=int, default=8192)
parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch")
parser.add_argument("--run-dir", default=None, help="default: paratrain run's, or runs/paratrain")
args = parser.parse_args()

# Initialise the distributed process group
# (rank, local rank, world size from the launcher; device cuda:<local rank>, or the CPU)
run = pt.Run(run_dir=args.run_dir, progress=False)

# Build the model and move it to this process's GPU
# (run.setup moves it to run.device and wraps it in DDP when there are several ranks)
model = torch.nn.Linear(1000, 10)
ddp_model = run.setup(model)

# Training logic...
dataset = teacher_dataset(args.samples, (1000,))
dataloader = run.loader(dataset, batch_size=args.batch_size)  # a new shuffle every epoch
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)

for epoch in run.epochs(args.epochs):
    correct = torch.zeros((), device=run.device)
    for x, y in dataloader:
        output = ddp_model(x)
        loss = criterion(output, y)
        run.backward(loss)
        run.step(optimizer)
        correct += (output.argmax(dim=1) == y).sum()
    correct = run.reduce(correct, "sum")
    run.save()
    mean_loss = run.reduce(loss.detach(), "mean").item()
    run.log({"loss": mean_loss, "accuracy": correct.item() / len(dataset)})
    run.print(f"Epoch {epoch}, Loss: {mean_loss:.4f}, Accuracy: {correct / len(dataset):.4f}")

run.save_weights(ddp_model, run.run_dir / "model.pth")
run.close()
