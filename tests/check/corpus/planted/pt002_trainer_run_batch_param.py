"""Multi-GPU trainer class (torchrun) for a small regression model.

Planted: PT002 - _run_batch does a bare source.to(self.local_rank) on the tensor its caller passes in.
"""
import os

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, get_rank, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RandomRegression(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.rank = get_rank()
        self.model = DDP(model.to(self.local_rank), device_ids=[self.local_rank])
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every

    def _run_batch(self, source, targets):
        source.to(self.local_rank)  # planted: PT002
        targets = targets.to(self.local_rank)
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        total = torch.zeros(2, device=torch.device("cuda", self.local_rank))
        for source, targets in self.train_data:
            total[0] += self._run_batch(source, targets)
            total[1] += 1
        torch.distributed.all_reduce(total)
        if self.rank == 0:
            print(f"Epoch {epoch} | mean loss {(total[0] / total[1]).item():.5f}")

    def _save_checkpoint(self, epoch):
        torch.save(self.model.module.state_dict(), f"checkpoint_{epoch}.pt")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and epoch % self.save_every == 0:
                self._save_checkpoint(epoch)


def main(total_epochs=20, save_every=5, batch_size=32):
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    init_process_group(backend="nccl")
    dataset = RandomRegression(2048)
    loader = DataLoader(dataset, batch_size=batch_size, pin_memory=True, sampler=DistributedSampler(dataset))
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    Trainer(model, loader, optimizer, save_every).train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    main()
