"""Token classification (NER) fine-tuning on plain torch DDP, imported as tdist; batches are dicts.

Planted: PT020 - under `match tdist.get_rank(): case 0:` the eval accuracy correct/total of rank 0's shard is printed
"""
import argparse
import os

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForTokenClassification, DataCollatorForTokenClassification, AutoTokenizer

from ner_data import load_conll2003


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_name_or_path", default="bert-base-cased")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--learning_rate", type=float, default=3e-5)
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--output_dir", default="ner_out")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    tdist.init_process_group(backend="nccl")
    device = torch.device("cuda", local_rank)

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    train_ds, eval_ds, label_list = load_conll2003(tokenizer)
    collator = DataCollatorForTokenClassification(tokenizer)
    train_sampler = DistributedSampler(train_ds)
    train_dataloader = DataLoader(train_ds, sampler=train_sampler, collate_fn=collator, batch_size=args.batch_size)
    eval_dataloader = DataLoader(eval_ds, sampler=DistributedSampler(eval_ds, shuffle=False),
                                 collate_fn=collator, batch_size=args.batch_size)

    model = AutoModelForTokenClassification.from_pretrained(args.model_name_or_path, num_labels=len(label_list))
    model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)

    for epoch in range(args.num_train_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for batch in train_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        model.eval()
        correct, total = 0, 0
        for batch in eval_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                predictions = model(**batch).logits.argmax(dim=-1)
            mask = batch["labels"] != -100
            correct += (predictions[mask] == batch["labels"][mask]).sum().item()
            total += mask.sum().item()

        match tdist.get_rank():
            case 0:
                print(f"epoch {epoch}: token accuracy {correct / total:.4f}")  # planted: PT020
                os.makedirs(args.output_dir, exist_ok=True)
                torch.save(model.module.state_dict(), os.path.join(args.output_dir, "model.bin"))
            case _:
                pass

    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
