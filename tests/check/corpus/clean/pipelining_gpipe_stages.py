"""Pipeline-parallel training with torch.distributed.pipelining (one stage per rank, GPipe schedule)."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

N_LAYERS, DIM, VOCAB, SEQ = 16, 1024, 32000, 256


class StageModule(nn.Module):
    """The slice of a decoder stack owned by one pipeline stage."""

    def __init__(self, stage_idx, n_stages):
        super().__init__()
        per = N_LAYERS // n_stages
        self.embed = nn.Embedding(VOCAB, DIM) if stage_idx == 0 else None
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(DIM, 16, 4 * DIM, batch_first=True, norm_first=True)
                                    for _ in range(per))
        last = stage_idx == n_stages - 1
        self.norm = nn.LayerNorm(DIM) if last else None
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False) if last else None

    def forward(self, h):
        if self.embed is not None:
            h = self.embed(h)
        mask = nn.Transformer.generate_square_subsequent_mask(h.size(1), device=h.device)
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        if self.lm_head is not None:
            h = self.lm_head(self.norm(h))
        return h


def lm_loss(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank)
    is_first, is_last = rank == 0, rank == world - 1

    torch.manual_seed(rank)
    module = StageModule(rank, world).to(device)
    stage = PipelineStage(module, rank, world, device)
    n_micro = 8
    schedule = ScheduleGPipe(stage, n_microbatches=n_micro, loss_fn=lm_loss)
    opt = torch.optim.AdamW(module.parameters(), lr=2e-4)

    g = torch.Generator(device="cpu").manual_seed(1234)
    for step in range(1000):
        tokens = torch.randint(0, VOCAB, (4 * n_micro, SEQ + 1), generator=g).to(device)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        opt.zero_grad(set_to_none=True)
        if is_first:
            schedule.step(inputs)
        elif is_last:
            losses = []
            schedule.step(target=targets, losses=losses)
        else:
            schedule.step()
        opt.step()
        if is_last and step % 50 == 0:
            mean_loss = torch.stack(losses).mean().item()
            print(f"[last stage, rank {rank}] step {step} loss {mean_loss:.4f}")

    torch.save(module.state_dict(), f"pp_stage{rank}_of{world}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
