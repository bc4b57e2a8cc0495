"""Seed 002, section 4.2, "方法1:使用torchrun启动" (method 1: start with torchrun): the
torchrun template, started with ``torchrun --nproc_per_node=2 train.py``. Needs CUDA (nccl);
the port is torchrun_template_paratrain.py.

The tutorial stops at "# training logic..."; the part below that line is not in it. It follows
the checklist of seed 003 for that logic: a DistributedSampler (the DataLoader itself not
shuffling), 2-4 workers per process with pinned memory, batch_size per GPU, inputs moved with
.to(local_rank), metrics summed with all_reduce, and only rank 0 printing and saving
model.module.state_dict(). The checklist does not mention sampler.set_epoch, and neither does
this loop.
"""

# train.py example
import torch
import torch.distributed as dist
from standins import teacher_dataset  # not in the tutorial: generated data
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader  # not in the tutorial
from torch.utils.data.distributed import DistributedSampler  # not in the tutorial

# Initialise the distributed process group
dist.init_process_group(backend="nccl")
local_rank = dist.get_rank()
torch.cuda.set_device(local_rank)

# Build the model and move it to this process's GPU
model = torch.nn.Linear(1000, 10).to(local_rank)
ddp_model = DDP(model, device_ids=[local_rank])

# Training logic...
dataset = teacher_dataset(8192, (1000,))
sampler = DistributedSampler(dataset)
dataloader = DataLoader(
    dataset, batch_size=32, shuffle=False, sampler=sampler, num_workers=4, pin_memory=True
)
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)

for epoch in range(10):
    correct = torch.zeros((), device=local_rank)
    for x, y in dataloader:
        x, y = x.to(local_rank), y.to(local_rank)
        output = ddp_model(x)
        loss = criterion(output, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        correct += (output.argmax(dim=1) == y).sum()
    dist.all_reduce(correct)
    if dist.get_rank() == 0:
        print(f"Epoch {epoch}, Loss: {loss.item():.4f}, Accuracy: {correct / len(dataset):.4f}")
        torch.save(ddp_model.module.state_dict(), "model.pth")

dist.destroy_process_group()
