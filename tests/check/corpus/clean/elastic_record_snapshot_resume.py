"""Fault-tolerant training under torchrun --max-restarts: @record, env vars and a snapshot file."""
import logging
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from torchvision.models import resnet18

log = logging.getLogger("elastic")


class ElasticTrainer:
    def __init__(self, snapshot_path: str, total_epochs: int) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.node = os.environ.get("GROUP_RANK", "0")
        self.device = torch.device("cuda", self.local_rank)
        self.snapshot_path = snapshot_path
        self.total_epochs = total_epochs
        self.epochs_run = 0

        net = resnet18(num_classes=100).to(self.device)
        self.optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True)
        if os.path.exists(snapshot_path):
            self._load_snapshot(net)
        self.model = DDP(net, device_ids=[self.local_rank])

        ds = TensorDataset(torch.randn(20_000, 3, 32, 32), torch.randint(0, 100, (20_000,)))
        self.sampler = DistributedSampler(ds)
        self.loader = DataLoader(ds, batch_size=128, sampler=self.sampler, num_workers=4, persistent_workers=True)

    def _load_snapshot(self, net) -> None:
        snapshot = torch.load(self.snapshot_path, map_location=self.device, weights_only=True)
        net.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIM_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        log.info("node %s rank %d resumed at epoch %d (restart #%d)", self.node, self.global_rank,
                 self.epochs_run, self.restart_count)

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "OPTIM_STATE": self.optimizer.state_dict(),
                    "EPOCHS_RUN": epoch + 1}
        tmp = self.snapshot_path + ".tmp"
        torch.save(snapshot, tmp)
        os.replace(tmp, self.snapshot_path)
        log.info("epoch %d | snapshot saved at %s", epoch, self.snapshot_path)

    def _run_epoch(self, epoch: int) -> float:
        self.sampler.set_epoch(epoch)
        self.model.train()
        total = torch.zeros(2, device=self.device)
        for source, targets in self.loader:
            source = source.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            self.optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.model(source), targets)
            loss.backward()
            self.optimizer.step()
            total += torch.stack([loss.detach() * targets.size(0), torch.tensor(targets.size(0), device=self.device, dtype=torch.float)])
        dist.all_reduce(total)
        return (total[0] / total[1]).item()

    def train(self) -> None:
        for epoch in range(self.epochs_run, self.total_epochs):
            t0 = time.monotonic()
            mean_loss = self._run_epoch(epoch)
            if self.global_rank == 0:
                log.info("epoch %d | loss %.4f | %.1fs", epoch, mean_loss, time.monotonic() - t0)
                self._save_snapshot(epoch)


@record
def main() -> None:
    logging.basicConfig(level=logging.INFO, format=f"[rank {os.environ.get('RANK', '?')}] %(message)s")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend="nccl")
    trainer = ElasticTrainer(os.environ.get("SNAPSHOT_PATH", "/shared/snapshot.pt"), total_epochs=90)
    trainer.train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
