"""HF run_mlm_no_trainer shape on plain DDP: MLM collator, bf16 autocast without scaler, guard variable is_primary, step-based checkpoints."""
import math
import os

import torch
import torch.distributed as tdist
from datasets import load_from_disk
from torch.nn.parallel import DistributedDataParallel as NativeDDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from tqdm.auto import trange
from transformers import AutoModelForMaskedLM, AutoTokenizer, DataCollatorForLanguageModeling


def main(model_name="roberta-base", data_dir="tokenized", out_dir="mlm-out", epochs=2, bs=16, ckpt_every=1000):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    tdist.init_process_group("nccl")
    is_primary = tdist.get_rank() == 0
    world = tdist.get_world_size()
    device = torch.device("cuda", local_rank)

    tokenizer = AutoTokenizer.from_pretrained(model_name)
    ds = load_from_disk(data_dir)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    sampler = DistributedSampler(ds["train"], num_replicas=world, rank=tdist.get_rank(), seed=42)
    loader = DataLoader(ds["train"], batch_size=bs, sampler=sampler, collate_fn=collator,
                        num_workers=2, drop_last=True)
    eval_loader = DataLoader(ds["validation"], batch_size=bs, collate_fn=collator,
                             sampler=DistributedSampler(ds["validation"], shuffle=False))

    model = NativeDDP(AutoModelForMaskedLM.from_pretrained(model_name).to(device), device_ids=[local_rank])
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=1e-4, total_steps=epochs * len(loader))
    if is_primary:
        os.makedirs(out_dir, exist_ok=True)

    global_step = 0
    for epoch in trange(epochs, disable=not is_primary, desc="epoch"):
        sampler.set_epoch(epoch)
        model.train()
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            sched.step()
            optim.zero_grad(set_to_none=True)
            global_step += 1
            if global_step % ckpt_every == 0 and is_primary:
                torch.save({"model": model.module.state_dict(), "optim": optim.state_dict(),
                            "sched": sched.state_dict(), "step": global_step},
                           os.path.join(out_dir, f"step_{global_step}.pt"))
        model.eval()
        stats = torch.zeros(2, device=device)
        with torch.no_grad():
            for batch in eval_loader:
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(**batch).loss
                stats += torch.stack([loss.float() * batch["input_ids"].shape[0],
                                      torch.tensor(batch["input_ids"].shape[0], device=device, dtype=torch.float)])
        tdist.all_reduce(stats, op=tdist.ReduceOp.SUM)
        eval_loss = (stats[0] / stats[1]).item()
        if is_primary:
            print(f"epoch {epoch}: eval loss {eval_loss:.4f} ppl {math.exp(eval_loss):.2f}")
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
