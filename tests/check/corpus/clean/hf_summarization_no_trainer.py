"""HF run_summarization_no_trainer shape on plain DDP: seq2seq training, eval with model.module.generate, gathered ROUGE inputs."""
import os

import evaluate
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq


def is_main_process() -> bool:
    return dist.get_rank() == 0


def train_epoch(model, loader, optimizer, scheduler, device, accum_steps):
    model.train()
    for step, batch in enumerate(loader):
        batch = {k: v.to(device) for k, v in batch.items()}
        loss = model(**batch).loss
        loss = loss / accum_steps
        loss.backward()
        if (step + 1) % accum_steps == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()


def evaluate_rouge(model, loader, tokenizer, device, metric):
    model.eval()
    world = dist.get_world_size()
    for batch in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.no_grad():
            generated = model.module.generate(input_ids=batch["input_ids"],
                                              attention_mask=batch["attention_mask"], max_length=128)
        labels = torch.where(batch["labels"] != -100, batch["labels"], tokenizer.pad_token_id)
        decoded_preds = tokenizer.batch_decode(generated, skip_special_tokens=True)
        decoded_labels = tokenizer.batch_decode(labels, skip_special_tokens=True)
        gathered = [None] * world
        dist.all_gather_object(gathered, (decoded_preds, decoded_labels))
        if is_main_process():
            for preds, refs in gathered:
                metric.add_batch(predictions=preds, references=refs)
    if is_main_process():
        return metric.compute(use_stemmer=True)
    return None


def main(model_name="t5-small", data=None, epochs=3, accum_steps=2, output_dir="sum-out"):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    device = torch.device(f"cuda:{local_rank}")

    tokenizer = AutoTokenizer.from_pretrained(model_name)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_name).to(device)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    train_sampler = DistributedSampler(data["train"])
    train_loader = DataLoader(data["train"], batch_size=8, sampler=train_sampler, collate_fn=collator)
    eval_loader = DataLoader(data["validation"], batch_size=16, collate_fn=collator,
                             sampler=DistributedSampler(data["validation"], shuffle=False))
    model = DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    total = epochs * len(train_loader) // accum_steps
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.0, total_iters=total)
    metric = evaluate.load("rouge")

    for epoch in range(epochs):
        train_sampler.set_epoch(epoch)
        train_epoch(model, train_loader, optimizer, scheduler, device, accum_steps)
        result = evaluate_rouge(model, eval_loader, tokenizer, device, metric)
        if is_main_process():
            print({k: round(v * 100, 2) for k, v in result.items()})
    if is_main_process():
        model.module.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
        torch.save(optimizer.state_dict(), os.path.join(output_dir, "optimizer.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
