"""ddp_spawn_original.py on paratrain: no hard-coded address, port, backend or device; the loss
printed is the mean over ranks; a checkpoint and the final weights are saved.

    python ddp_spawn_paratrain.py                                # one process
    paratrain run --nproc 2 ddp_spawn_paratrain.py               # 2 ranks (gloo on CPU)
    python ddp_spawn_paratrain.py --nproc 2                      # 2 ranks started by the script,
                                                                 # as mp.spawn did (pt.launch)
"""

import argparse

import torch
import torch.nn as nn

import paratrain as pt


def train(args):
    # Initialise the process group
    # (from the launcher: paratrain run, torchrun or pt.launch; one process without one)
    run = pt.Run(run_dir=args.run_dir, progress=False)

    # Set the device: cuda:<local rank>, or the CPU
    device = run.device

    # Create the model (run.setup moves it to the device, and wraps it in DDP on several ranks)
    model = nn.Linear(10, 10)
    ddp_model = run.setup(model)

    # Training loop
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr)

    for step in range(run.global_step, args.steps):
        data = torch.randn(20, 10).to(device)
        target = torch.randn(20, 10).to(device)

        output = ddp_model(data)
        loss = loss_fn(output, target)

        run.backward(loss)
        run.step(optimizer)

        if step % 20 == 0:
            mean_loss = run.reduce(loss.detach(), "mean").item()
            run.log({"loss": mean_loss}, step=step)
            run.print(f"Step {step}, Loss: {mean_loss:.4f}")

    run.save()
    run.save_weights(ddp_model, run.run_dir / "model.pt")
    run.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="DDP template (mp.spawn), ported")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--nproc", type=int, default=1, help="ranks to start here (pt.launch)")
    parser.add_argument("--run-dir", default=None, help="default: paratrain run's run dir")
    args = parser.parse_args()
    if args.nproc > 1:
        pt.launch(train, nproc=args.nproc, args=(args,))
    else:
        train(args)
