"""HF run_ner_no_trainer shape on plain DDP: token classification with a match statement on the rank for reporting and saving."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForTokenClassification, DataCollatorForTokenClassification


def token_accuracy(model, loader, device):
    model.eval()
    counts = torch.zeros(2, dtype=torch.long, device=device)
    with torch.no_grad():
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            preds = model(**batch).logits.argmax(-1)
            mask = batch["labels"] != -100
            counts[0] += (preds[mask] == batch["labels"][mask]).sum()
            counts[1] += mask.sum()
    dist.all_reduce(counts)
    return counts[0].item() / max(counts[1].item(), 1)


def main(tokenizer, train_ds, eval_ds, label_list, epochs=3, out="ner.pt"):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    device = torch.device("cuda", local_rank)

    collator = DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=8)
    sampler = DistributedSampler(train_ds, shuffle=True, seed=1234)
    train_dl = DataLoader(train_ds, batch_size=16, sampler=sampler, collate_fn=collator)
    eval_dl = DataLoader(eval_ds, batch_size=32, collate_fn=collator,
                         sampler=DistributedSampler(eval_ds, shuffle=False))
    model = AutoModelForTokenClassification.from_pretrained("bert-base-cased", num_labels=len(label_list))
    model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        for batch in train_dl:
            batch = {k: v.to(device) for k, v in batch.items()}
            out_ = model(**batch)
            out_.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        acc = token_accuracy(model, eval_dl, device)
        match dist.get_rank():
            case 0:
                print(f"epoch {epoch}: token accuracy {acc:.4f}")
                torch.save({"model": model.module.state_dict(), "labels": label_list, "epoch": epoch}, out)
            case _:
                pass
    dist.destroy_process_group()
