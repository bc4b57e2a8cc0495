"""DeiT fine-tune shape: load a pretrained checkpoint on CPU, drop the head, interpolate pos-embed, resume on every rank."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from timm.models import create_model


def get_args():
    p = argparse.ArgumentParser("DeiT fine-tuning")
    p.add_argument("--model", default="deit_base_patch16_224")
    p.add_argument("--finetune", default="")
    p.add_argument("--resume", default="")
    p.add_argument("--nb-classes", type=int, default=100)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--output-dir", default="out")
    return p.parse_args()


def interpolate_pos_embed(model, checkpoint_model):
    pos_embed = checkpoint_model["pos_embed"]
    num_extra = model.pos_embed.shape[-2] - model.patch_embed.num_patches
    orig = int((pos_embed.shape[-2] - num_extra) ** 0.5)
    new = int(model.patch_embed.num_patches ** 0.5)
    if orig == new:
        return
    extra, tokens = pos_embed[:, :num_extra], pos_embed[:, num_extra:]
    tokens = tokens.reshape(-1, orig, orig, pos_embed.shape[-1]).permute(0, 3, 1, 2)
    tokens = F.interpolate(tokens, size=(new, new), mode="bicubic", align_corners=False)
    tokens = tokens.permute(0, 2, 3, 1).flatten(1, 2)
    checkpoint_model["pos_embed"] = torch.cat((extra, tokens), dim=1)


def main():
    args = get_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    global_rank = dist.get_rank()
    device = torch.device("cuda", local_rank)

    model = create_model(args.model, pretrained=False, num_classes=args.nb_classes)
    if args.finetune:
        if args.finetune.startswith("https"):
            checkpoint = torch.hub.load_state_dict_from_url(args.finetune, map_location="cpu", check_hash=True)
        else:
            checkpoint = torch.load(args.finetune, map_location="cpu", weights_only=True)
        checkpoint_model = checkpoint["model"]
        state_dict = model.state_dict()
        for k in ["head.weight", "head.bias", "head_dist.weight", "head_dist.bias"]:
            if k in checkpoint_model and checkpoint_model[k].shape != state_dict[k].shape:
                if global_rank == 0:
                    print(f"Removing key {k} from pretrained checkpoint")
                del checkpoint_model[k]
        interpolate_pos_embed(model, checkpoint_model)
        msg = model.load_state_dict(checkpoint_model, strict=False)
        if global_rank == 0:
            print(msg)
    model.to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=5e-4, weight_decay=0.05)
    start_epoch = 0
    if args.resume:
        ckpt = torch.load(args.resume, map_location={"cuda:0": f"cuda:{local_rank}"}, weights_only=True)
        model_without_ddp.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch = ckpt["epoch"] + 1
    n_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if global_rank == 0:
        print(f"number of params: {n_parameters}")
    for epoch in range(start_epoch, args.epochs):
        # training loop elided: same engine as pre-training
        if global_rank == 0:
            torch.save({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch, "args": vars(args)}, os.path.join(args.output_dir, "checkpoint.pth"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
