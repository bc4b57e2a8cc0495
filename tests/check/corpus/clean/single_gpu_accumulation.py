"""Single-GPU fine-tune shape: gradient accumulation with loss /= N, scheduler and zero_grad inside the step branch."""
import argparse

import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="distilbert-base-uncased")
    p.add_argument("--micro_batch", type=int, default=8)
    p.add_argument("--accumulation_steps", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()

    from datasets import load_dataset
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(args.model)
    ds = load_dataset("imdb")
    ds = ds.map(lambda b: tok(b["text"], truncation=True, padding="max_length", max_length=256), batched=True)
    ds = ds.rename_column("label", "labels").with_format("torch", columns=["input_ids", "attention_mask", "labels"])
    train_loader = DataLoader(ds["train"], batch_size=args.micro_batch, shuffle=True)
    test_loader = DataLoader(ds["test"], batch_size=64)

    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    total_updates = args.epochs * len(train_loader) // args.accumulation_steps
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.06 * total_updates), total_updates)

    for epoch in range(args.epochs):
        model.train()
        optimizer.zero_grad()
        for i, batch in enumerate(train_loader):
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch).loss
            loss /= args.accumulation_steps
            loss.backward()
            if (i + 1) % args.accumulation_steps == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if i % 500 == 0:
                print(f"epoch {epoch} step {i} loss {loss.item() * args.accumulation_steps:.4f}")
        model.eval()
        correct = 0
        with torch.no_grad():
            for batch in test_loader:
                batch = {k: v.to(device) for k, v in batch.items()}
                correct += (model(**batch).logits.argmax(-1) == batch["labels"]).sum().item()
        print(f"epoch {epoch}: test accuracy {correct / len(ds['test']):.4f}")
    model.save_pretrained("imdb-distilbert")


if __name__ == "__main__":
    main()
