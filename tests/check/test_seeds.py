"""``paratrain check`` on the code of the five seed tutorials (``shared/seeds/*.txt``).

Each row of ``SNIPPETS`` is one snippet as its tutorial writes it (line breaks and indentation
put back where the page ran them together; comments translated), with the set of rules it must
trip. Labels say what the row is: "bad:" a mistake the tutorial warns about, "fixed:" the
correction it gives, "(not warned about: ...)" a mistake it makes without saying so; a row
without these is code the tutorial shows in passing, which must stay clean.

A fragment stays a fragment: ``paratrain check`` knows ``torch``, ``dist``, ``nn``, ``DDP``,
``DataLoader`` and ``DistributedSampler`` without their imports, so no line had to be added.
Seed 001's page lost its ``=``, ``==``, ``>``, quotes, commas and colons; they are put back and
nothing else is changed. Seed 003 has no code blocks, only inline code in its checklist: its
rows put that inline code in the statement the sentence describes (``from_text=True``), as does
one row of seed 004's tips. Warnings no rule covers are listed in ``GAPS`` with the reason.

    pytest tests/check/test_seeds.py -q
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from pathlib import Path
from typing import NamedTuple

import pytest

from paratrain.commands.check.engine import check_source, rules_by_id

SEEDS = Path(__file__).resolve().parents[3] / "shared" / "seeds"
S000 = "000_330b5c1fc844d778.txt"
S001 = "001_52c94ee1f15bc427.txt"
S002 = "002_62e5cc1073cdf641.txt"
S003 = "003_f40384e9323f0a9b.txt"
S004 = "004_55a4190d8fd86731.txt"


class Snippet(NamedTuple):
    seed: str
    label: str
    code: str
    expected: frozenset[str]
    from_text: bool = False
    """Written from the tutorial's sentence and inline code (seed 003 has no code blocks)."""


def row(seed: str, label: str, code: str, *rules: str, from_text: bool = False) -> Snippet:
    return Snippet(seed, label, textwrap.dedent(code), frozenset(rules), from_text)


SNIPPETS = [
    # 000: "PyTorch多GPU训练与模型保存实用指南" (multi-GPU training and saving models).
    row(S000, "GPU check", """
        import torch
        print("CUDA Available:", torch.cuda.is_available())
        print("GPU Count:", torch.cuda.device_count())
        print("Current Device:", torch.cuda.current_device())
        print("Device Name:", torch.cuda.get_device_name(0))
    """),
    row(S000, "single-GPU loop, model and batch moved", """
        model = MyModel().to(device)
        for data, target in train_loader:
            data = data.to(device)
            target = target.to(device)
            output = model(data)
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """),
    row(S000, "bad: data.to(device) alone (see GAPS)", """
        data.to(device)  # wrong! the original data is still on the CPU
    """),
    row(S000, "bad: data.to(device) in the seed's loop", """
        model = MyModel().to(device)
        for data, target in train_loader:
            data.to(device)  # wrong! the original data is still on the CPU
            target = target.to(device)
            output = model(data)
    """, "PT002"),
    row(S000, "fixed: the result assigned", """
        data = data.to(device)  # right
    """),
    row(S000, "bad: DataParallel (the seed lists its drawbacks)", """
        model = MyModel()
        if torch.cuda.device_count() > 1:
            print(f"Using {torch.cuda.device_count()} GPUs!")
            model = torch.nn.DataParallel(model)
        model.to(device)
    """, "PT014"),
    row(S000, "bad: DataParallel on GPUs 1 and 2, the model on `device` (see GAPS)", """
        gpu_ids = [1, 2]
        model = torch.nn.DataParallel(model, device_ids=gpu_ids)
        model.to(device)
    """, "PT014"),
    row(S000, "DataLoader without pinned memory", """
        train_loader = DataLoader(dataset, batch_size=64, pin_memory=False)
    """),
    row(S000, "AMP with torch.cuda.amp (not warned about: deprecated)", """
        scaler = torch.cuda.amp.GradScaler()
        for data, target in train_loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            with torch.cuda.amp.autocast():
                output = model(data)
                loss = criterion(output, target)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    """, "PT012"),
    row(S000, "bad: the whole model saved", """
        torch.save(model, 'model.pkl')
    """, "PT007"),
    row(S000, "fixed: only the parameters saved", """
        torch.save(model.state_dict(), 'params.pth')
    """),
    row(S000, "fixed: state_dict saved and loaded (not warned about: no weights_only)", """
        # save
        torch.save(model.state_dict(), 'model.pth')
        # load (the same architecture defined first)
        model = MyModel()
        model.load_state_dict(torch.load('model.pth'))
        model.to(device)
    """, "PT008"),
    row(S000, "fixed: DataParallel's inner model saved", """
        if isinstance(model, torch.nn.DataParallel):
            torch.save(model.module.state_dict(), 'model.pth')
        else:
            torch.save(model.state_dict(), 'model.pth')
    """),
    row(S000, "bad: module. prefix saved, alone (see GAPS)", """
        torch.save(model.state_dict(), 'model_dp.pth')  # includes the module. prefix
    """),
    row(S000, "bad: module. prefix saved, after the seed's DataParallel snippet", """
        model = MyModel()
        if torch.cuda.device_count() > 1:
            print(f"Using {torch.cuda.device_count()} GPUs!")
            model = torch.nn.DataParallel(model)
        model.to(device)
        torch.save(model.state_dict(), 'model_dp.pth')  # includes the module. prefix
    """, "PT006", "PT014"),
    row(S000, "prefix stripped when loading (not warned about: no weights_only)", """
        from collections import OrderedDict
        state_dict = torch.load('model_dp.pth')
        new_state_dict = OrderedDict((k.replace('module.', ''), v) for k, v in state_dict.items())
        model.load_state_dict(new_state_dict)
    """, "PT008"),
    row(S000, "fixed: map_location='cpu' (not warned about: no weights_only)", """
        # load on the CPU a model saved on a GPU
        model.load_state_dict(
            torch.load('model.pth', map_location='cpu')
        )
    """, "PT008"),
    row(S000, "fixed: map_location='cuda' (not warned about: no weights_only)", """
        model.load_state_dict(
            torch.load('model_cpu.pth', map_location='cuda')
        )
    """, "PT008"),
    row(S000, "recommended workflow: DataParallel, and torch.cuda.amp (not warned about)", """
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader

        # 1. Device setup
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

        # 2. Build the model
        model = MyModel()

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
    """, "PT012", "PT014"),
    # 001: "PyTorch多GPU训练实战" (from placing by hand to distributed data parallel).
    row(S001, "GPU check", """
        import torch
        print(f"PyTorch版本: {torch.__version__}")
        print(f"CUDA可用: {torch.cuda.is_available()}")
        print(f"GPU数量: {torch.cuda.device_count()}")
        print(f"当前GPU: {torch.cuda.current_device()}")
        print(f"设备名称: {torch.cuda.get_device_name(0)}")
    """),
    row(S001, "bad: one device for several GPUs (see GAPS)", """
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model.to(device)
    """),
    row(S001, "one chosen GPU", """
        # use the second GPU (indices start at 0)
        device = torch.device("cuda:1")
        model.to(device)
    """),
    row(S001, "bad: DataParallel (slow beyond 4 GPUs, says the seed)", """
        model = nn.Linear(10, 5)
        if torch.cuda.device_count() > 1:
            print(f"使用 {torch.cuda.device_count()} 块GPU")
            model = nn.DataParallel(model)
        model.to(device)
    """, "PT014"),
    row(S001, "bad: SyncBatchNorm as the BatchNorm fix under DataParallel", """
        model = nn.DataParallel(model)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    """, "PT013", "PT014"),
    row(S001, "DDP Trainer (not warned about: its DistributedSampler is never used)", """
        import torch.distributed as dist
        def setup(rank, world_size):
            os.environ["MASTER_ADDR"] = "localhost"
            os.environ["MASTER_PORT"] = "12355"
            dist.init_process_group("nccl", rank=rank, world_size=world_size)
        def cleanup():
            dist.destroy_process_group()
        class Trainer:
            def __init__(self, rank, world_size):
                setup(rank, world_size)
                self.model = MyModel().to(rank)
                self.model = DDP(self.model, device_ids=[rank])
                self.optimizer = torch.optim.Adam(self.model.parameters())
            def train(self, dataloader):
                sampler = DistributedSampler(dataloader, num_replicas=world_size, rank=rank)
                for batch in dataloader:
                    inputs, labels = batch
                    inputs = inputs.to(rank)
                    labels = labels.to(rank)
                    outputs = self.model(inputs)
                    loss = criterion(outputs, labels)
                    loss.backward()
                    self.optimizer.step()
    """, "PT003"),
    row(S001, "mp.spawn start", """
        import torch.multiprocessing as mp
        def main():
            world_size = 4
            mp.spawn(train_worker, args=(world_size,), nprocs=world_size)
        if __name__ == "__main__":
            main()
    """),
    row(S001, "AMP from torch.cuda.amp (not warned about: deprecated)", """
        from torch.cuda.amp import autocast, GradScaler
        scaler = GradScaler()
        with autocast():
            outputs = model(inputs)
            loss = criterion(outputs, labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """, "PT012"),
    row(S001, "pipeline parallel with Pipe (not warned about: removed)", """
        from torch.distributed.pipeline.sync import Pipe
        model = nn.Sequential(
            Layer1().to("cuda:0"),
            Layer2().to("cuda:1"),
            Layer3().to("cuda:2")
        )
        model = Pipe(model, chunks=8)  # split the batch into 8 micro-batches
    """, "PT015"),
    row(S001, "tensor parallel by hand", """
        class ParallelLinear(nn.Module):
            def __init__(self, in_features, out_features):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(out_features//2, in_features, device="cuda:0"))
                self.weight2 = nn.Parameter(torch.randn(out_features//2, in_features, device="cuda:1"))
            def forward(self, x):
                x1 = x.to("cuda:0") @ self.weight.t()
                x2 = x.to("cuda:1") @ self.weight2.t()
                return torch.cat([x1, x2], dim=1)
    """),  # noqa: E501 (as the seed writes it)
    row(S001, "fixed: only rank 0 logs", """
        if dist.get_rank() == 0:
            print(f"Epoch {epoch} Loss: {loss.item()}")
    """),
    row(S001, "profiler", """
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=3),
            on_trace_ready=torch.profiler.tensorboard_trace_handler("./log")
        ) as p:
            for step in dataloader:
                train_step()
                p.step()
    """),
    # 002: "PyTorch GPU版本安装" (installing PyTorch for GPUs, multi-GPU setup).
    row(S002, "GPU check and a sum on the GPU", """
        import torch
        # check that a GPU is available
        print("PyTorch版本:", torch.__version__)
        print("GPU是否可用:", torch.cuda.is_available())
        print("GPU设备数量:", torch.cuda.device_count())
        print("当前GPU名称:", torch.cuda.get_device_name(0))
        # a simple computation on the GPU
        x = torch.tensor([1.0, 2.0]).cuda()
        y = torch.tensor([3.0, 4.0]).cuda()
        z = x + y
        print("GPU计算结果:", z.cpu().numpy())
    """),
    row(S002, "torchrun template (not warned about: the global rank as the GPU)", """
        # train.py example
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        # initialise the distributed process group
        dist.init_process_group(backend='nccl')
        local_rank = dist.get_rank()
        torch.cuda.set_device(local_rank)
        # build the model and move it to this process's GPU
        model = torch.nn.Linear(1000, 10).to(local_rank)
        ddp_model = DDP(model, device_ids=[local_rank])
        # training logic...
    """, "PT001"),
    row(S002, "DataParallel (not warned about: one process drives every GPU)", """
        # simple data parallelism (for models smaller than one GPU's memory)
        model = torch.nn.Linear(1000, 10).cuda()
        ddp_model = torch.nn.DataParallel(model)
        # the data is spread over the GPUs during training
        for epoch in range(10):
            for data, target in dataloader:
                data, target = data.cuda(), target.cuda()
                output = ddp_model(data)
                loss = criterion(output, target)
                loss.backward()
                optimizer.step()
    """, "PT014"),
    row(S002, "model parallel by hand", """
        # put the model's layers on different GPUs
        model = torch.nn.Sequential(
            torch.nn.Linear(1000, 512).cuda(0),
            torch.nn.ReLU().cuda(0),
            torch.nn.Linear(512, 256).cuda(1),
            torch.nn.ReLU().cuda(1),
            torch.nn.Linear(256, 10).cuda(1)
        )
    """),
    row(S002, "DataLoader with workers and pinned memory", """
        from torch.utils.data import DataLoader
        dataloader = DataLoader(
            dataset,
            batch_size=128,
            shuffle=True,
            num_workers=4,  # loader workers
            pin_memory=True,  # page-locked memory, faster copies to the GPU
        )
    """),
    row(S002, "AMP from torch.cuda.amp (not warned about: deprecated)", """
        from torch.cuda.amp import GradScaler, autocast
        scaler = GradScaler()
        for epoch in range(10):
            for data, target in dataloader:
                data, target = data.cuda(), target.cuda()
                with autocast():
                    output = ddp_model(data)
                    loss = criterion(output, target)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
    """, "PT012"),
    row(S002, "memory monitor", """
        import torch
        def monitor_memory():
            total = torch.cuda.get_device_properties(0).total_memory / (1024**3)
            used = torch.cuda.memory_allocated(0) / (1024**3)
            print(f"显存使用: {used:.2f}GB / {total:.2f}GB")
    """),
    row(S002, "rendezvous address set by hand", """
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = "12345"
    """),
    row(S002, "gradient checkpointing", """
        from torch.utils.checkpoint import checkpoint
        def forward(self, x):
            x = checkpoint(self.layer1, x)
            x = checkpoint(self.layer2, x)
            return self.layer3(x)
    """),
    row(S002, "ResNet-50 case study (not warned about: the global rank as GPU, rank 0's loss)", """
        import torch
        import torch.nn as nn
        import torch.optim as optim
        from torchvision import models, transforms, datasets
        from torch.utils.data.distributed import DistributedSampler
        from torch.nn.parallel import DistributedDataParallel as DDP
        # initialise the distributed environment
        dist.init_process_group(backend='nccl')
        local_rank = dist.get_rank()
        torch.cuda.set_device(local_rank)
        # preprocessing
        transform = transforms.Compose([
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ])
        # the dataset
        dataset = datasets.ImageNet('/path/to/imagenet', transform=transform)
        sampler = DistributedSampler(dataset)
        dataloader = torch.utils.data.DataLoader(
            dataset, batch_size=64, sampler=sampler, num_workers=4, pin_memory=True
        )
        # the model
        model = models.resnet50(pretrained=False)
        model.fc = nn.Linear(model.fc.in_features, 1000)
        model = model.to(local_rank)
        ddp_model = DDP(model, device_ids=[local_rank])
        # loss and optimizer
        criterion = nn.CrossEntropyLoss()
        optimizer = optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        # training loop
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
                print(f"Epoch {epoch+1}, Loss: {running_loss / len(dataloader):.4f}")
    """, "PT001", "PT020"),
    # 003: "多GPU加速训练技巧" (a checklist for multi-GPU training; inline code only).
    row(S003, "bad: DataParallel", """
        model = torch.nn.DataParallel(model)
    """, "PT014", from_text=True),
    row(S003, "fixed: model moved, then wrapped in DDP", """
        model.to(local_rank)
        model = DDP(model, device_ids=[local_rank])
    """, from_text=True),
    row(S003, "fixed: the batch moved to the local rank", """
        x = x.to(local_rank)
    """, from_text=True),
    row(S003, "bad: the loader shuffles next to a DistributedSampler", """
        loader = DataLoader(
            dataset, batch_size=32, shuffle=True, sampler=DistributedSampler(dataset)
        )
    """, "PT004", from_text=True),
    row(S003, "fixed: shuffle=False, the sampler shuffles", """
        loader = DataLoader(
            dataset, batch_size=32, shuffle=False, sampler=DistributedSampler(dataset)
        )
    """, from_text=True),
    row(S003, "bad: the sampler's epoch never reset", """
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=32, sampler=sampler)
        for epoch in range(epochs):
            for x, y in loader:
                train_step(x, y)
    """, "PT005", from_text=True),
    row(S003, "fixed: sampler.set_epoch(epoch)", """
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=32, sampler=sampler)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                train_step(x, y)
    """, from_text=True),
    row(S003, "bad: model.state_dict() of the DDP model saved", """
        model = DDP(model, device_ids=[local_rank])
        torch.save(model.state_dict(), "model.pth")
    """, "PT006", from_text=True),
    row(S003, "fixed: model.module.state_dict() saved", """
        model = DDP(model, device_ids=[local_rank])
        torch.save(model.module.state_dict(), "model.pth")
    """, from_text=True),
    row(S003, "bad: every rank saves and writes TensorBoard", """
        dist.init_process_group("nccl")
        model = DDP(model, device_ids=[local_rank])
        writer = SummaryWriter("runs")
        torch.save(model.module.state_dict(), "model.pth")
    """, "PT010", from_text=True),
    row(S003, "fixed: only rank 0 saves and writes TensorBoard", """
        dist.init_process_group("nccl")
        model = DDP(model, device_ids=[local_rank])
        if dist.get_rank() == 0:
            writer = SummaryWriter("runs")
            torch.save(model.module.state_dict(), "model.pth")
    """, from_text=True),
    row(S003, "bad: every rank prints the log", """
        dist.init_process_group("nccl")
        model = DDP(model, device_ids=[local_rank])
        for batch in loader:
            loss = model(batch)
            loss.backward()
            print(loss.item())
    """, "PT016", from_text=True),
    row(S003, "bad: accuracy counted per rank and reported by rank 0 without all_reduce", """
        dist.init_process_group("nccl")
        model = DDP(model, device_ids=[local_rank])
        loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += y.size(0)
        if dist.get_rank() == 0:
            print(correct / total)
    """, "PT020", from_text=True),
    row(S003, "fixed: the counts all_reduced before rank 0 reports them", """
        dist.init_process_group("nccl")
        model = DDP(model, device_ids=[local_rank])
        loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += y.size(0)
        counts = torch.tensor([correct, total], device=local_rank)
        torch.distributed.all_reduce(counts)
        if dist.get_rank() == 0:
            print(counts[0].item() / counts[1].item())
    """, from_text=True),
    row(S003, "fixed: only rank 0 prints the log", """
        dist.init_process_group("nccl")
        model = DDP(model, device_ids=[local_rank])
        for batch in loader:
            loss = model(batch)
            loss.backward()
            if dist.get_rank() == 0:
                print(loss.item())
    """, from_text=True),
    # 004: "PyTorch-CUDA-v2.9镜像中的分布式训练配置模板" (a DDP template for a CUDA image).
    row(S004, "one training step on one device", """
        import torch
        import torch.nn as nn
        import torch.optim as optim
        class SimpleNet(nn.Module):
            def __init__(self):
                super(SimpleNet, self).__init__()
                self.fc = nn.Linear(784, 10)
            def forward(self, x):
                return self.fc(x)
        # choose the device
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = SimpleNet().to(device)
        # data and loss
        inputs = torch.randn(64, 784).to(device)
        labels = torch.randint(0, 10, (64,)).to(device)
        criterion = nn.CrossEntropyLoss()
        optimizer = optim.SGD(model.parameters(), lr=0.01)
        # one training step
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()
        print(f"Training completed with loss: {loss.item():.4f}")
    """),
    row(S004, "CUDA check and a matmul on the GPU", """
        import torch
        if torch.cuda.is_available():
            print("CUDA is available.")
            print(f"Number of GPUs: {torch.cuda.device_count()}")
            print(f"Current GPU: {torch.cuda.get_device_name(torch.cuda.current_device())}")
            x = torch.randn(1000, 1000).cuda()
            y = torch.randn(1000, 1000).cuda()
            z = torch.mm(x, y)
            print(f"Matrix multiplication completed on {z.device}")
        else:
            print("CUDA not available!")
    """),
    row(S004, "bad: DataParallel (production should use DDP, says the seed)", """
        model = nn.DataParallel(model)
    """, "PT014"),
    row(S004, "torch.cuda.amp.GradScaler, as its tips say (not warned about: deprecated)", """
        scaler = torch.cuda.amp.GradScaler()
    """, "PT012", from_text=True),
    row(S004, "bad: logs on every rank (its tips: log only when rank == 0)", """
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        ddp_model = DDP(model, device_ids=[local_rank])
        for step in range(100):
            loss = loss_fn(ddp_model(data), target)
            loss.backward()
            print(f"Step {step}, Loss: {loss.item():.4f}")
    """, "PT016", from_text=True),
    row(S004, "fixed: the DDP template with mp.spawn, rank 0 logs", """
        import os
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
        from torch.nn.parallel import DistributedDataParallel as DDP
        import torch.nn as nn
        def train(rank, world_size):
            # initialise the process group
            os.environ['MASTER_ADDR'] = 'localhost'
            os.environ['MASTER_PORT'] = '12355'
            dist.init_process_group("nccl", rank=rank, world_size=world_size)
            # set the device
            device = torch.device(f"cuda:{rank}")
            torch.cuda.set_device(device)
            # create the model
            model = nn.Linear(10, 10).to(device)
            ddp_model = DDP(model, device_ids=[rank])
            # training loop
            loss_fn = nn.MSELoss()
            optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.001)
            for step in range(100):
                data = torch.randn(20, 10).to(device)
                target = torch.randn(20, 10).to(device)
                output = ddp_model(data)
                loss = loss_fn(output, target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if rank == 0 and step % 20 == 0:
                    print(f"Step {step}, Loss: {loss.item():.4f}")
            dist.destroy_process_group()
        if __name__ == "__main__":
            world_size = torch.cuda.device_count()
            mp.spawn(train, args=(world_size,), nprocs=world_size, join=True)
    """),
    row(S004, "GPU count", """
        import torch
        print(torch.cuda.device_count())  # should print the number of visible GPUs
    """),
]  # fmt: skip


class Gap(NamedTuple):
    seed: str
    mistake: str
    why: str


GAPS = [
    Gap(S000, "`data.to(device)` written alone, the result dropped",
        "nothing in the fragment says `data` is a tensor: modules move in place and return "
        "themselves, so PT002 needs to see the tensor made (a factory, a batch from a loader); "
        "it finds the same line in the seed's loop"),
    Gap(S000, "`torch.save(model.state_dict(), ...)` of a DataParallel model, written alone",
        "nothing in the fragment says `model` is wrapped; PT006 finds it after the seed's "
        "DataParallel snippet"),
    Gap(S000, "DataParallel with device_ids=[1, 2] and the model moved to cuda:0",
        "DataParallel wants the model on device_ids[0]; `device` is only known at run time "
        "(torch.device('cuda' if ... else 'cpu')), and PT014 already flags the DataParallel"),
    Gap(S000, "a per-GPU batch too small (< 32) for the communication to pay off",
        "a speed judgement that depends on the model and the hardware, not a bug in the code"),
    Gap(S000, "torch.load without map_location when the loading machine differs",
        "PT009 looks only at scripts that use torch.distributed: in one process the checkpoint "
        "usually returns to the device it was saved from, and a CPU-only machine fails at once "
        "with a message naming map_location"),
    Gap(S001, "`model.to(device)` expected to use every GPU",
        "the code is right for one GPU; whether more were meant is not in the code (PT014 and "
        "the DDP rules cover the multi-GPU forms)"),
    Gap(S001, "CUDA and PyTorch versions that do not match",
        "an installation problem, not in the script: `paratrain doctor` checks the install"),
    Gap(S002, "CUDA not detected, or a CUDA/PyTorch version mismatch",
        "an installation problem, not in the script: `paratrain doctor` checks the install"),
    Gap(S002, "`dist.init_process_group` refused (Connection refused): MASTER_ADDR/PORT, network",
        "decided by the environment and the network at run time; `paratrain doctor` shows "
        "MASTER_* and checks that MASTER_PORT is free"),
    Gap(S002, "out of memory: batch too large, no gradient checkpointing",
        "depends on the model, the batch and the GPU; `paratrain bench` measures peak memory"),
    Gap(S003, "started with `python train.py` instead of torchrun / torch.distributed.run",
        "how a script is started is not in the script (a shell command or a job file)"),
    Gap(S003, "a DDP script whose DataLoader has no DistributedSampler at all",
        "the dataset may already be sharded per rank (an IterableDataset, per-rank files), which "
        "the checker cannot see; PT003 finds a sampler made and not used"),
    Gap(S003, "num_workers and batch_size meant as global instead of per process",
        "a matter of intent: both are valid numbers either way"),
    Gap(S003, "`.cuda()` instead of `.to(local_rank)` in a DDP script",
        "right whenever torch.cuda.set_device(local_rank) ran first, which may happen in another "
        "file; PT001 flags a wrong set_device"),
    Gap(S003, "the loss not a scalar, or on another GPU, at loss.backward()",
        "shapes and devices are run-time values"),
    Gap(S003, "validation: the sampler's drop_last", "padding or dropping the last samples "
        "changes the metric slightly; both are legitimate choices"),
    Gap(S004, "NCCL across GPUs with different drivers; multi-node MASTER_ADDR and SSH",
        "the machines' setup, not the script"),
    Gap(S004, "the global batch not kept equal to single-GPU runs (per-GPU batch x GPUs)",
        "a matter of intent: the per-rank batch is a valid number either way"),
]  # fmt: skip


def rules_found(code: str) -> set[str]:
    """The rule ids every rule finds in ``code``."""
    found = check_source(ast.parse(code), code.splitlines(), "snippet.py", rules_by_id().values())
    return {f.rule for f in found}


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"{s.seed[:3]}: {s.label}" for s in SNIPPETS])
def test_each_seed_snippet_trips_exactly_its_rules(snippet: Snippet) -> None:
    assert rules_found(snippet.code) == snippet.expected


def test_every_seed_has_snippets_and_every_rule_named_exists() -> None:
    assert {s.seed for s in SNIPPETS} == {S000, S001, S002, S003, S004}
    named = {r for s in SNIPPETS for r in s.expected}
    assert named <= set(rules_by_id())
    fixed = [s for s in SNIPPETS if s.label.startswith("fixed:")]
    assert fixed and all(not s.expected or "not warned about" in s.label for s in fixed)
    assert all(g.seed in {S000, S001, S002, S003, S004} and g.why for g in GAPS)
    referred = {s.seed for s in SNIPPETS if "see GAPS" in s.label}
    assert referred <= {g.seed for g in GAPS}


def _code_words(text: str) -> str:
    """The ASCII letters and digits of ``text``: spacing, punctuation and comments aside."""
    return re.sub(r"[^A-Za-z0-9]", "", text)


def _without_comments(code: str) -> list[str]:
    tokens = tokenize.generate_tokens(io.StringIO(code).readline)
    comments = {(t.start[0], t.start[1]) for t in tokens if t.type == tokenize.COMMENT}
    lines = code.splitlines()
    for line_no, col in comments:
        lines[line_no - 1] = lines[line_no - 1][:col]
    return lines


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the seed tutorials are not at {SEEDS}")
@pytest.mark.parametrize(
    "snippet",
    [s for s in SNIPPETS if not s.from_text],
    ids=[f"{s.seed[:3]}: {s.label}" for s in SNIPPETS if not s.from_text],
)
def test_each_snippet_line_is_in_its_seed(snippet: Snippet) -> None:
    """Faithful: every line of code (comments aside) occurs in the tutorial's text."""
    seed = _code_words((SEEDS / snippet.seed).read_text(encoding="utf-8"))
    missing = [line for line in _without_comments(snippet.code) if _code_words(line) not in seed]
    assert missing == []
