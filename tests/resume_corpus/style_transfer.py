"""pytorch/examples ``fast_neural_style`` (``neural_style.py train``), ported to paratrain.

    python style_transfer.py [--epochs 2]
    paratrain run --nproc 2 style_transfer.py

Shape: a frozen VGG-like loss network that is not trained (kept outside ``run.setup``, on
``run.device``); the style's Gram matrices computed once before training; content and style
losses summed; running averages of both losses printed every few batches; the model exported
every ``checkpoint_interval`` batches to ``ckpt_epoch_E_batch_id_B.pth`` (eval mode, on the
CPU, then back to training) and at the end. Changes a restart needs: the batch number in an
export's name comes from ``run.global_step`` (``enumerate`` restarts at 0 after a mid-epoch
resume); the export is written before ``run.save()`` (a kill between them then repeats the
export rather than losing it); the final export's name has no ``time.ctime()`` (a name that
changes with every run cannot be compared).
"""

from __future__ import annotations

import argparse

import torch
from style_transfer_model import (
    LossNet,
    TransformerNet,
    gram_matrix,
    images,
    losses,
    normalize_batch,
    style_image,
)

import paratrain as pt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--log-interval", type=int, default=2)
    parser.add_argument("--checkpoint-interval", type=int, default=3)
    args = parser.parse_args()
    run = pt.Run(seed=args.seed, progress=False)
    train_loader = run.loader(images(), batch_size=args.batch_size)
    transformer = TransformerNet()
    optimizer = torch.optim.Adam(transformer.parameters(), args.lr)
    transformer, optimizer = run.setup(transformer, optimizer)
    vgg = LossNet().to(run.device)
    features_style = vgg(normalize_batch(style_image(args.batch_size).to(run.device)))
    gram_style = [gram_matrix(y) for y in features_style]
    run.resume()
    steps_per_epoch = len(images()) // (args.batch_size * run.world_size)
    for e in run.epochs(args.epochs):
        transformer.train()
        agg_content_loss = agg_style_loss = 0.0
        for batch_id, (x, _) in enumerate(train_loader):
            content_loss, style_loss = losses(transformer, vgg, x, gram_style)
            run.backward(content_loss + style_loss)
            run.step(optimizer)
            agg_content_loss += content_loss.item()
            agg_style_loss += style_loss.item()
            if (batch_id + 1) % args.log_interval == 0:
                run.print(
                    f"Epoch {e + 1}: content {agg_content_loss / (batch_id + 1):.6f} "
                    f"style {agg_style_loss / (batch_id + 1):.6f}"
                )
            in_epoch = run.global_step - e * steps_per_epoch  # batches of this epoch so far
            if in_epoch % args.checkpoint_interval == 0:
                if run.is_main:
                    state = run.unwrap(transformer).state_dict()
                    name = f"ckpt_epoch_{e}_batch_id_{in_epoch}.pth"
                    torch.save({k: v.cpu() for k, v in state.items()}, run.run_dir / name)
                run.save()
    if run.is_main:
        state = run.unwrap(transformer).state_dict()
        torch.save(
            {k: v.cpu() for k, v in state.items()}, run.run_dir / f"epoch_{args.epochs}.model"
        )
    run.save()
    run.close()


if __name__ == "__main__":
    main()
