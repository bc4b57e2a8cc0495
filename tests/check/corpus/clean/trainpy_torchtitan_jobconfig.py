"""Step-based pretraining entry point with a nested job config and a device mesh."""
import gc
import logging
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, IterableDataset

logger = logging.getLogger("titan")


@dataclass
class TrainingSection:
    steps: int = 1000
    batch_size: int = 8
    seq_len: int = 2048
    max_norm: float = 1.0
    compile: bool = True


@dataclass
class OptimizerSection:
    lr: float = 3e-4
    warmup_steps: int = 200


@dataclass
class CheckpointSection:
    folder: str = "outputs/checkpoint"
    interval: int = 250


@dataclass
class JobConfig:
    training: TrainingSection = field(default_factory=TrainingSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    log_freq: int = 10


class ShardedTokenStream(IterableDataset):
    """Each data-parallel rank reads its own slice of the stream; no sampler needed."""

    def __init__(self, seq_len: int, dp_rank: int, dp_degree: int) -> None:
        self.seq_len, self.dp_rank, self.dp_degree = seq_len, dp_rank, dp_degree

    def __iter__(self):
        g = torch.Generator().manual_seed(17 + self.dp_rank)
        while True:
            chunk = torch.randint(0, 50257, (self.seq_len + 1,), generator=g)
            yield chunk[:-1], chunk[1:]


def build_model(vocab: int = 50257, dim: int = 768, depth: int = 12) -> nn.Module:
    layers = [nn.TransformerEncoderLayer(dim, 12, 4 * dim, batch_first=True, norm_first=True) for _ in range(depth)]
    return nn.ModuleDict({"emb": nn.Embedding(vocab, dim), "layers": nn.ModuleList(layers), "head": nn.Linear(dim, vocab)})


def forward(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    h = model["emb"](tokens)
    for layer in model["layers"]:
        h = layer(h, is_causal=True, src_mask=nn.Transformer.generate_square_subsequent_mask(h.size(1), device=h.device))
    return model["head"](h)


def linear_warmup(warmup: int):
    return lambda step: min(1.0, (step + 1) / warmup)


def main(job: JobConfig) -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}")
    dist.init_process_group(backend="cuda:nccl,cpu:gloo")
    mesh = init_device_mesh("cuda", (world_size,), mesh_dim_names=("dp",))
    dp_rank = mesh.get_local_rank("dp")

    model = build_model()
    for layer in model["layers"]:
        if job.training.compile:
            layer.compile()
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to(device)

    opt = torch.optim.AdamW(model.parameters(), lr=job.optimizer.lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup(job.optimizer.warmup_steps))
    loader = DataLoader(ShardedTokenStream(job.training.seq_len, dp_rank, world_size), batch_size=job.training.batch_size)
    data_iter = iter(loader)

    step = 0
    ckpt_path = os.path.join(job.checkpoint.folder, "step-latest")
    if os.path.isdir(ckpt_path):
        state = {"model": get_model_state_dict(model), "step": 0}
        dcp.load(state, checkpoint_id=ckpt_path)
        model.load_state_dict(state["model"])
        step = state["step"]

    gc.disable()
    while step < job.training.steps:
        step += 1
        if step % 50 == 0:
            gc.collect(1)
        inputs, labels = next(data_iter)
        inputs = inputs.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = forward(model, inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), job.training.max_norm)
        opt.step()
        sched.step()
        opt.zero_grad()

        if step % job.log_freq == 0:
            stats = torch.stack([loss.detach(), grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm])
            dist.all_reduce(stats, op=dist.ReduceOp.AVG)
            if dist.get_rank() == 0:
                logger.info("step %5d  loss %.4f  grad_norm %.3f  lr %.2e", step, stats[0].item(), stats[1].item(), sched.get_last_lr()[0])

        if step % job.checkpoint.interval == 0 or step == job.training.steps:
            state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt), "step": step}
            dcp.save(state, checkpoint_id=ckpt_path)

    dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    main(JobConfig())
