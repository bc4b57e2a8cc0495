"""detectron2 plain_train_net shape: launch() spawning per-machine workers, comm helpers, EventStorage-free loop, synchronize()."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


class comm:
    @staticmethod
    def get_world_size():
        return dist.get_world_size() if dist.is_initialized() else 1

    @staticmethod
    def get_rank():
        return dist.get_rank() if dist.is_initialized() else 0

    @staticmethod
    def get_local_rank():
        return int(os.environ.get("LOCAL_RANK", 0))

    @staticmethod
    def is_main_process():
        return comm.get_rank() == 0

    @staticmethod
    def synchronize():
        if comm.get_world_size() > 1:
            dist.barrier()


def _distributed_worker(local_rank, main_func, world_size, num_gpus_per_machine, machine_rank, dist_url, args):
    global_rank = machine_rank * num_gpus_per_machine + local_rank
    os.environ["LOCAL_RANK"] = str(local_rank)
    dist.init_process_group(backend="NCCL", init_method=dist_url, world_size=world_size, rank=global_rank)
    torch.cuda.set_device(local_rank)
    comm.synchronize()
    main_func(*args)


def launch(main_func, num_gpus_per_machine, num_machines=1, machine_rank=0, dist_url="tcp://127.0.0.1:50152", args=()):
    world_size = num_machines * num_gpus_per_machine
    mp.start_processes(_distributed_worker, nprocs=num_gpus_per_machine, start_method="spawn", daemon=False,
                       args=(main_func, world_size, num_gpus_per_machine, machine_rank, dist_url, args))


def do_train(cfg, model, data_loader, optimizer, scheduler):
    model.train()
    device = torch.device("cuda", comm.get_local_rank())
    for iteration, data in zip(range(cfg.max_iter), data_loader):
        data = [{k: v.to(device) if torch.is_tensor(v) else v for k, v in d.items()} for d in data]
        loss_dict = model(data)
        losses = sum(loss_dict.values())
        reduced = {k: v.detach().clone() for k, v in loss_dict.items()}
        for v in reduced.values():
            dist.all_reduce(v, op=dist.ReduceOp.AVG)
        optimizer.zero_grad()
        losses.backward()
        optimizer.step()
        scheduler.step()
        if comm.is_main_process() and (iteration + 1) % 20 == 0:
            print(f"iter {iteration + 1}: " + " ".join(f"{k}={v.item():.3f}" for k, v in reduced.items()))
        if (iteration + 1) % cfg.checkpoint_period == 0:
            if comm.is_main_process():
                torch.save({"model": model.module.state_dict(), "iteration": iteration},
                           os.path.join(cfg.output_dir, f"model_{iteration:07d}.pth"))
            comm.synchronize()


def main(cfg, build_model, build_train_loader):
    model = build_model(cfg).to(torch.device("cuda", comm.get_local_rank()))
    model = DistributedDataParallel(model, device_ids=[comm.get_local_rank()], broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.base_lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: min(1.0, (it + 1) / 1000))
    do_train(cfg, model, build_train_loader(cfg), optimizer, scheduler)
