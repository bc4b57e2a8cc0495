"""Speech-to-text fine-tuning of a Whisper checkpoint with DDP and gathered WER."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from transformers import WhisperForConditionalGeneration, WhisperProcessor, get_linear_schedule_with_warmup


def word_errors(ref, hyp):
    r, h = ref.split(), hyp.split()
    d = list(range(len(h) + 1))
    for i in range(1, len(r) + 1):
        prev, d[0] = d[0], i
        for j in range(1, len(h) + 1):
            cur = min(d[j] + 1, d[j - 1] + 1, prev + (r[i - 1] != h[j - 1]))
            prev, d[j] = d[j], cur
    return d[len(h)], len(r)


class SpeechClips(Dataset):
    def __init__(self, processor, n):
        self.processor, self.n = processor, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        audio = torch.randn(16000 * 5).numpy()
        feats = self.processor.feature_extractor(audio, sampling_rate=16000, return_tensors="pt").input_features[0]
        text = f"utterance number {i}"
        labels = self.processor.tokenizer(text, return_tensors="pt").input_ids[0]
        return {"input_features": feats, "labels": labels, "text": text}


def collate(batch):
    feats = torch.stack([b["input_features"] for b in batch])
    labels = torch.nn.utils.rnn.pad_sequence([b["labels"] for b in batch], batch_first=True, padding_value=-100)
    return {"input_features": feats, "labels": labels, "text": [b["text"] for b in batch]}


def evaluate(model, loader, processor, device):
    model.eval()
    errors = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.inference_mode():
        for batch in loader:
            feats = batch["input_features"].to(device, dtype=torch.bfloat16)
            pred_ids = model.module.generate(input_features=feats, max_new_tokens=64, language="en", task="transcribe")
            hyps = processor.batch_decode(pred_ids, skip_special_tokens=True)
            for ref, hyp in zip(batch["text"], hyps):
                e, n = word_errors(ref.lower(), hyp.lower().strip())
                errors[0] += e
                errors[1] += n
    dist.all_reduce(errors, op=dist.ReduceOp.SUM)
    model.train()
    return (errors[0] / errors[1].clamp(min=1)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="openai/whisper-small")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", default="whisper-ft")
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device(f"cuda:{local_rank}")

    processor = WhisperProcessor.from_pretrained(args.model)
    model = WhisperForConditionalGeneration.from_pretrained(args.model, torch_dtype=torch.bfloat16).to(device)
    model.config.forced_decoder_ids = None
    model.model.encoder.requires_grad_(False)
    model = DistributedDataParallel(model, device_ids=[local_rank])

    train_ds, eval_ds = SpeechClips(processor, 4000), SpeechClips(processor, 400)
    train_sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=args.batch, sampler=train_sampler, collate_fn=collate, num_workers=4)
    eval_loader = DataLoader(eval_ds, batch_size=args.batch, collate_fn=collate,
                             sampler=DistributedSampler(eval_ds, shuffle=False))

    optimizer = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), lr=1e-5)
    scheduler = get_linear_schedule_with_warmup(optimizer, 500, args.epochs * len(train_loader))

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        for step, batch in enumerate(train_loader):
            feats = batch["input_features"].to(device, dtype=torch.bfloat16)
            labels = batch["labels"].to(device)
            loss = model(input_features=feats, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            if rank == 0 and step % 100 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} (rank-0 batch)")
        wer = evaluate(model, eval_loader, processor, device)
        if rank == 0:
            print(f"epoch {epoch}: WER {100 * wer:.2f}%")
            model.module.save_pretrained(os.path.join(args.out, f"epoch-{epoch}"))
            processor.save_pretrained(os.path.join(args.out, f"epoch-{epoch}"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
