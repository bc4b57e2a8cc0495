"""FSDP fine-tune shape: transformer auto-wrap, bf16 MixedPrecision, full state dict gathered to rank 0 under a guard variable."""
import functools
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, StateDictType
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer


def setup():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    return local_rank, dist.get_rank(), dist.get_world_size()


def train_epoch(model, loader, optimizer, epoch, local_rank, rank):
    model.train()
    loader.sampler.set_epoch(epoch)
    fsdp_loss = torch.zeros(2, device=local_rank)
    for batch in loader:
        batch = {k: v.to(local_rank) for k, v in batch.items()}
        optimizer.zero_grad()
        output = model(**batch)
        output.loss.backward()
        optimizer.step()
        fsdp_loss[0] += output.loss.item()
        fsdp_loss[1] += 1
    dist.all_reduce(fsdp_loss, op=dist.ReduceOp.SUM)
    if rank == 0:
        print(f"Train Epoch: {epoch} \tLoss: {fsdp_loss[0] / fsdp_loss[1]:.6f}")


def main(dataset, model_name="meta-llama/Llama-2-7b-hf", epochs=2, out="llama_ft.pt"):
    local_rank, rank, world_size = setup()
    is_primary = rank == 0
    sampler = DistributedSampler(dataset, rank=rank, num_replicas=world_size, shuffle=True)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2, pin_memory=True)
    wrap_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    bf16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(model_name)
    model = FSDP(model, auto_wrap_policy=wrap_policy, mixed_precision=bf16,
                 device_id=torch.cuda.current_device(), use_orig_params=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.85)
    for epoch in range(1, epochs + 1):
        train_epoch(model, loader, optimizer, epoch, local_rank, rank)
        scheduler.step()
    dist.barrier()
    save_policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, save_policy):
        cpu_state = model.state_dict()
    if is_primary:
        torch.save(cpu_state, out)
    dist.destroy_process_group()
