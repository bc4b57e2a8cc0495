"""An out-of-memory error that explains itself: which rank, in which phase of the step, what held
the memory, and the smallest change that fits, each with its predicted peak.

    with pt.Run(...) as run:           # a rank that raises OOM inside the block leaves, on exit,
        ...                            # one paragraph on stderr and in run_dir/oom/rank<r>.txt

``paratrain run`` puts that paragraph in its failure summary. The phase is read from the error's
traceback (autograd's backward, ``torch.optim``, paratrain's save, else the forward and loss), so
nothing is recorded on the step's hot path. What the memory held is counted from the run's own
models and optimizers (their parameters, gradients and state), and the rest of what the device's
allocator (or, on CPU, the process) held when it failed is the forward's activations and the
step's temporaries.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

PHASES = ("forward", "backward", "optimizer", "save")


def is_out_of_memory(error: BaseException) -> bool:
    """A CUDA/accelerator OOM, Python's ``MemoryError``, or torch's CPU allocator giving up."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text.lower()
    )


def phase_of(error: BaseException) -> str:
    """``backward``, ``optimizer``, ``save`` or ``forward``, from where ``error`` was raised."""
    files = [
        frame.filename.replace("\\", "/") for frame in traceback.extract_tb(error.__traceback__)
    ]
    if any(
        "/paratrain/runtime/save_restore.py" in f or "/paratrain/checkpoint/" in f for f in files
    ):
        return "save"
    if any("/torch/optim/" in f for f in files):
        return "optimizer"
    if any(f.endswith(("/torch/autograd/__init__.py", "/torch/autograd/graph.py")) for f in files):
        return "backward"
    return "forward"


@dataclass
class Held:
    """Bytes one rank held when it ran out of memory."""

    parameters: int
    gradients: int
    optimizer: int
    total: int
    """What the allocator (CUDA) or the process (CPU, resident set) held."""
    device: str

    @property
    def state(self) -> int:
        return self.parameters + self.gradients + self.optimizer

    @property
    def activations(self) -> int:
        """The rest: activations and temporaries of the step."""
        return max(self.total - self.state, 0)


def _bytes(tensor: torch.Tensor) -> int:
    local = getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard on this rank
    return int(local.numel() * local.element_size())


def held(
    models: list[nn.Module], optimizers: list[Optimizer], device: torch.device, *, rss_before: int
) -> Held:
    """Count what ``models`` and ``optimizers`` hold, and what the device held in all: on CUDA
    the allocator's peak, on CPU the process's resident memory beyond ``rss_before`` (what it held
    when ``pt.Run`` started: libraries, and any model built before), but never less than the
    state counted."""
    seen: set[int] = set()
    params = grads = state = 0
    for model in models:
        for p in model.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            params += _bytes(p)
            grads += _bytes(p.grad) if p.grad is not None else 0
        params += sum(_bytes(b) for b in model.buffers())
    for optimizer in optimizers:
        for values in optimizer.state.values():
            state += sum(_bytes(v) for v in values.values() if isinstance(v, torch.Tensor))
    if device.type == "cuda":
        total = int(torch.cuda.max_memory_allocated(device))
        where = f"{torch.cuda.get_device_name(device)} ({device})"
    else:
        import psutil

        total = int(psutil.Process().memory_info().rss) - rss_before
        where = "the host (resident memory since pt.Run started)"
    return Held(params, grads, state, max(total, params + grads + state), where)


def _gib(n: float) -> str:
    if n >= 2**28:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 10 * 2**20 else f"{n / 2**20:.1f} MiB"


def fixes(
    held: Held, *, wanted: int, strategy: str, world: int, grad_accum: int, blocks: int
) -> list[str]:
    """The smallest changes, each with the peak it would need: the activations (with the
    allocation that failed, ``wanted``) scale with the per-rank batch; sharding divides the
    state by the ranks."""
    a, s = held.activations + wanted, held.state
    out = [
        f"halve the per-rank batch and set grad_accum={2 * grad_accum} (the global batch stays): "
        f"about {_gib(s + a / 2)}"
    ]
    if blocks > 1:
        out.append(
            f"activation_checkpointing=<the class of your {blocks} repeated blocks> (activations "
            f"kept at block boundaries, one block recomputed in backward): about "
            f"{_gib(s + 2 * a / blocks)}"
        )
    if world > 1 and strategy not in ("fsdp", "hsdp"):
        out.append(
            f"strategy='fsdp' (state sharded over {world} ranks): about {_gib(s / world + a)}"
        )
    if world > 1 and strategy in ("fsdp", "hsdp") and held.device.startswith("NVIDIA"):
        out.append(f"fsdp_offload=True (sharded state in host memory): about {_gib(a)} on the GPU")
    return out


def repeated_blocks(models: list[nn.Module]) -> int:
    """The length of the longest ``ModuleList``/``Sequential`` of same-class modules (a model's
    layers), 0 if none."""
    best = 0
    for model in models:
        for module in model.modules():
            if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 1:
                kinds = {type(m) for m in module}
                if len(kinds) == 1:
                    best = max(best, len(module))
    return best


def asked(error: BaseException) -> int | None:
    """The allocation that failed, in bytes, when the error says (CUDA: "Tried to allocate 2.00
    GiB"; CPU: "you tried to allocate 123 bytes")."""
    text = str(error)
    found = re.search(r"tried to allocate (\d+) bytes", text, re.I)
    if found:
        return int(found.group(1))
    found = re.search(r"tried to allocate ([0-9.]+) (GiB|MiB|KiB)", text, re.I)
    if found:
        scale = {"gib": 2**30, "mib": 2**20, "kib": 2**10}[found.group(2).lower()]
        return int(float(found.group(1)) * scale)
    return None


PHASE_NAMES = {
    "forward": "forward (or loss)",
    "backward": "backward",
    "optimizer": "optimizer step",
    "save": "checkpoint save",
}


def explain(error: BaseException, *, rank: int, step: int, held: Held, fix_list: list[str]) -> str:
    """The paragraph (see the module docstring)."""
    kind = type(error).__name__
    wanted = asked(error) or 0
    more = f" and asked for {_gib(wanted)} more" if wanted else ""
    return (
        f"rank {rank} ran out of memory ({kind}) in the {PHASE_NAMES[phase_of(error)]} of step "
        f"{step + 1}, on {held.device}: it held {_gib(held.total)}{more}. Held: parameters "
        f"{_gib(held.parameters)}, gradients {_gib(held.gradients)}, optimizer state "
        f"{_gib(held.optimizer)}, activations and temporaries {_gib(held.activations)}. The step "
        f"needs about {_gib(held.total + wanted)}; changes, with the peak each would need: "
        + "; ".join(fix_list)
        + ". `paratrain plan` measures every strategy before launch."
    )


def write(text: str, folder: Path, rank: int) -> Path:
    """``folder/rank<r>.txt``, for ``paratrain run``'s failure summary."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{rank}.txt"
    path.write_text(text + "\n", encoding="utf-8")
    return path


def report(run: Any, error: BaseException) -> str:
    """Explain ``error`` raised inside ``run`` (a :class:`paratrain.Run`): the paragraph, also
    written to ``run_dir/oom/rank<r>.txt``."""
    models = [run.strategy.unwrap(u.module) for u in run.tracked.units]
    optimizers = [o for u in run.tracked.units for o in u.optimizers]
    counted = held(models, optimizers, run.device, rss_before=run.rss_at_start)
    fix_list = fixes(
        counted,
        wanted=asked(error) or 0,
        strategy=run.strategy.name,
        world=run.world_size,
        grad_accum=run.loop.grad_accum,
        blocks=repeated_blocks(models),
    )
    text = explain(error, rank=run.rank, step=run.loop.global_step, held=counted, fix_list=fix_list)
    write(text, run.layout.oom, run.rank)
    return text
