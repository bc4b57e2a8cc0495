"""Text-to-image UNet fine-tuning with plain torch.distributed (no accelerate)."""
import argparse
import copy
import logging
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from transformers import CLIPTextModel, CLIPTokenizer

logger = logging.getLogger(__name__)


class CaptionedImages(Dataset):
    def __init__(self, tokenizer, n=10_000, res=512):
        self.tokenizer, self.n, self.res = tokenizer, n, res

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = self.tokenizer(f"a photo number {i}", padding="max_length", truncation=True,
                             max_length=self.tokenizer.model_max_length, return_tensors="pt").input_ids[0]
        return {"pixel_values": torch.rand(3, self.res, self.res) * 2 - 1, "input_ids": ids}


@torch.no_grad()
def ema_update(ema_model, model, decay):
    for e, p in zip(ema_model.parameters(), model.parameters()):
        e.mul_(decay).add_(p.detach(), alpha=1 - decay)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--pretrained", default="runwayml/stable-diffusion-v1-5")
    p.add_argument("--output_dir", default="sd-finetuned")
    p.add_argument("--train_batch_size", type=int, default=4)
    p.add_argument("--num_train_epochs", type=int, default=10)
    p.add_argument("--learning_rate", type=float, default=1e-5)
    p.add_argument("--ema_decay", type=float, default=0.9999)
    p.add_argument("--checkpointing_steps", type=int, default=500)
    return p.parse_args()


def main():
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    global_rank = dist.get_rank()
    is_main_process = global_rank == 0
    device = torch.device("cuda", local_rank)
    logging.basicConfig(level=logging.INFO if is_main_process else logging.ERROR)

    tokenizer = CLIPTokenizer.from_pretrained(args.pretrained, subfolder="tokenizer")
    text_encoder = CLIPTextModel.from_pretrained(args.pretrained, subfolder="text_encoder")
    vae = AutoencoderKL.from_pretrained(args.pretrained, subfolder="vae")
    unet = UNet2DConditionModel.from_pretrained(args.pretrained, subfolder="unet")
    noise_scheduler = DDPMScheduler.from_pretrained(args.pretrained, subfolder="scheduler")

    vae.requires_grad_(False)
    text_encoder.requires_grad_(False)
    vae.to(device, dtype=torch.bfloat16)
    text_encoder.to(device, dtype=torch.bfloat16)
    unet.to(device)
    ema_unet = copy.deepcopy(unet).eval().requires_grad_(False)
    unet.enable_gradient_checkpointing()
    unet = DDP(unet, device_ids=[local_rank], output_device=local_rank)

    optimizer = torch.optim.AdamW(unet.parameters(), lr=args.learning_rate, weight_decay=1e-2)
    dataset = CaptionedImages(tokenizer)
    sampler = DistributedSampler(dataset, shuffle=True, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.train_batch_size, sampler=sampler, num_workers=4, pin_memory=True)
    num_update_steps = args.num_train_epochs * len(loader)
    lr_sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / num_update_steps)))

    global_step = 0
    for epoch in range(args.num_train_epochs):
        sampler.set_epoch(epoch)
        unet.train()
        for batch in loader:
            pixel_values = batch["pixel_values"].to(device, dtype=torch.bfloat16, non_blocking=True)
            input_ids = batch["input_ids"].to(device, non_blocking=True)
            with torch.no_grad():
                latents = vae.encode(pixel_values).latent_dist.sample() * vae.config.scaling_factor
                encoder_hidden_states = text_encoder(input_ids)[0]
            noise = torch.randn_like(latents)
            timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (latents.shape[0],), device=device).long()
            noisy = noise_scheduler.add_noise(latents, noise, timesteps)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                pred = unet(noisy, timesteps, encoder_hidden_states).sample
            loss = F.mse_loss(pred.float(), noise.float(), reduction="mean")
            loss.backward()
            torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
            optimizer.step()
            lr_sched.step()
            optimizer.zero_grad(set_to_none=True)
            ema_update(ema_unet, unet.module, args.ema_decay)
            global_step += 1

            if global_step % 50 == 0:
                avg = loss.detach().clone()
                dist.all_reduce(avg, op=dist.ReduceOp.SUM)
                avg /= dist.get_world_size()
                if is_main_process:
                    logger.info("step %d loss %.4f lr %.2e", global_step, avg.item(), lr_sched.get_last_lr()[0])
            if global_step % args.checkpointing_steps == 0 and is_main_process:
                os.makedirs(args.output_dir, exist_ok=True)
                torch.save({"unet": unet.module.state_dict(), "ema": ema_unet.state_dict(),
                            "optimizer": optimizer.state_dict(), "step": global_step},
                           os.path.join(args.output_dir, f"checkpoint-{global_step}.pt"))

    if is_main_process:
        ema_unet.save_pretrained(os.path.join(args.output_dir, "unet_ema"))
        unet.module.save_pretrained(os.path.join(args.output_dir, "unet"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
