"""fairseq Trainer shape: data_parallel_rank property, is_data_parallel_master, update_freq micro-batches with maybe_no_sync, stats all_reduced."""
import contextlib
import logging
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

logger = logging.getLogger(__name__)


class Trainer:
    def __init__(self, cfg, task, model, criterion):
        self.cfg = cfg
        self.task = task
        self.device = torch.device("cuda", cfg.distributed_training.device_id)
        self._model = model.to(device=self.device)
        self._criterion = criterion.to(device=self.device)
        self._wrapped_model = None
        self._optimizer = torch.optim.Adam(self._model.parameters(), lr=cfg.optimization.lr[0])
        self._num_updates = 0

    @property
    def data_parallel_world_size(self):
        return dist.get_world_size() if dist.is_initialized() else 1

    @property
    def data_parallel_rank(self):
        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def is_data_parallel_master(self):
        return self.data_parallel_rank == 0

    @property
    def model(self):
        if self._wrapped_model is None:
            if self.data_parallel_world_size > 1:
                self._wrapped_model = DistributedDataParallel(
                    self._model, device_ids=[self.cfg.distributed_training.device_id])
            else:
                self._wrapped_model = self._model
        return self._wrapped_model

    def train_step(self, samples):
        self.model.train()
        self._optimizer.zero_grad()
        logging_outputs, sample_size = [], 0
        for i, sample in enumerate(samples):
            sample = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in sample.items()}

            def maybe_no_sync():
                if self.data_parallel_world_size > 1 and hasattr(self.model, "no_sync") and i < len(samples) - 1:
                    return self.model.no_sync()
                return contextlib.ExitStack()

            with maybe_no_sync():
                loss, sample_size_i, logging_output = self.task.train_step(
                    sample, self.model, self._criterion, self._optimizer, self._num_updates)
                (loss / len(samples)).backward()
            logging_outputs.append(logging_output)
            sample_size += sample_size_i
        stats = torch.tensor([sum(l["loss"] for l in logging_outputs), sample_size],
                             dtype=torch.double, device=self.device)
        if self.data_parallel_world_size > 1:
            dist.all_reduce(stats)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optimization.clip_norm)
        self._optimizer.step()
        self._num_updates += 1
        return {"loss": (stats[0] / stats[1]).item(), "sample_size": int(stats[1].item())}

    def state_dict(self):
        return {"model": self._model.state_dict(), "optimizer": self._optimizer.state_dict(),
                "num_updates": self._num_updates}

    def save_checkpoint(self, filename):
        if self.is_data_parallel_master:
            logger.info(f"Saving checkpoint to {os.path.abspath(filename)}")
            torch.save(self.state_dict(), filename)

    def load_checkpoint(self, filename):
        if not os.path.exists(filename):
            return None
        state = torch.load(filename, map_location=torch.device("cpu"), weights_only=True)
        self._model.load_state_dict(state["model"], strict=True)
        self._optimizer.load_state_dict(state["optimizer"])
        self._num_updates = state["num_updates"]
        return state


def train_loop(cfg, trainer, epoch_itr):
    trainer.load_checkpoint(os.path.join(cfg.checkpoint.save_dir, "checkpoint_last.pt"))
    while epoch_itr.next_epoch_idx <= cfg.optimization.max_epoch:
        itr = epoch_itr.next_epoch_itr(shuffle=True)
        for samples in itr.grouped(cfg.optimization.update_freq[0]):
            log = trainer.train_step(samples)
            if trainer.is_data_parallel_master and trainer._num_updates % 100 == 0:
                print(f"epoch {epoch_itr.epoch:03d} | update {trainer._num_updates} | loss {log['loss']:.3f}")
        trainer.save_checkpoint(os.path.join(cfg.checkpoint.save_dir, "checkpoint_last.pt"))


def distributed_main(cfg, setup_task):
    cfg.distributed_training.device_id = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(cfg.distributed_training.device_id)
    dist.init_process_group(backend="nccl", init_method="env://")
    task, model, criterion, epoch_itr = setup_task(cfg)
    train_loop(cfg, Trainer(cfg, task, model, criterion), epoch_itr)
