"""Each rank's final state, written for ``paratrain verify-resume`` to compare across runs.

    final = FinalState(Path(env.final_state), pieces)    # PARATRAIN_FINAL_STATE=DIR
    final.start()         # also written at interpreter exit: most scripts never close their run
    final.write()         # run.close(): DIR/rank<r>.pt, once

Each rank writes only its own state, with no collective (it must work at exit, after the
process group may be gone, and for sharded strategies: rank r's file is compared with rank r's):

``models``      every registered model (unwrapped), its ``state_dict`` (DTensors as their local
                shards)
``optimizers``  ``{model name: [optimizer state_dict, ...]}``
``schedulers``, ``objects``, ``loaders``   what ``run.setup``/``run.track``/``run.loader``
                registered, as their ``state_dict`` (not the trackers' run ids)
``scaler``      the fp16 loss scaler
``loop``        epoch, global step, grad_accum
``rng``         torch CPU (and CUDA), numpy and python ``random`` generator states
``extras``      the extras of the last checkpoint saved or resumed
``meta``        rank, restart attempt, world size (not compared)

Values a file cannot hold safely become their type's name, so the file loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from paratrain.runtime.loop_state import LoopState
from paratrain.runtime.precision import Precision
from paratrain.runtime.registry import Registry
from paratrain.runtime.rng import capture_rng
from paratrain.trackers import STATE_NAME as TRACKER_STATE


@dataclass(kw_only=True)
class Pieces:
    """What a final state is made of, handed over explicitly."""

    tracked: Registry
    loop: LoopState
    precision: Precision
    unwrap: Callable[[nn.Module], nn.Module]
    extras: Callable[[], Mapping[str, Any]]
    """The extras of the last checkpoint saved or resumed."""
    rank: int
    restart: int
    world_size: int


class FinalState:
    """Writes ``directory/rank<r>.pt`` once: at ``write()`` or at interpreter exit."""

    def __init__(self, directory: Path, pieces: Pieces) -> None:
        self.directory = directory
        self.pieces = pieces
        self.written = False

    @property
    def path(self) -> Path:
        """This rank's file."""
        return self.directory / f"rank{self.pieces.rank}.pt"

    def start(self) -> None:
        """Write at interpreter exit unless :meth:`write` ran first."""
        atexit.register(self.write)

    def write(self) -> None:
        """Write this rank's state (once); a failure is reported, never raised."""
        if self.written:
            return
        self.written = True
        atexit.unregister(self.write)
        try:
            state = collect(self.pieces)
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            torch.save(state, tmp)
            os.replace(tmp, self.path)
        except Exception as err:  # at exit nothing may be left to catch it
            print(
                f"paratrain (rank {self.pieces.rank}): could not write the final state to "
                f"{self.path}: {type(err).__name__}: {err}",
                file=sys.stderr,
                flush=True,
            )


def collect(pieces: Pieces) -> dict[str, Any]:
    """This rank's state as plain data (see the module docstring)."""
    tracked = pieces.tracked
    return {
        "models": {u.name: local(pieces.unwrap(u.module).state_dict()) for u in tracked.units},
        "optimizers": {
            u.name: [local(o.state_dict()) for o in u.optimizers] for u in tracked.units
        },
        "schedulers": {k: local(v.state_dict()) for k, v in tracked.schedulers.items()},
        "objects": {
            k: local(v.state_dict()) for k, v in tracked.objects.items() if k != TRACKER_STATE
        },  # tracker run ids differ from run to run, and asking for them starts the runs
        "loaders": {ld.name: local(ld.state_dict()) for ld in tracked.loaders},
        "scaler": local(pieces.precision.state_dict()),
        "loop": pieces.loop.state_dict(),
        "rng": local(capture_rng()),
        "extras": local(dict(pieces.extras())),
        "meta": {"rank": pieces.rank, "restart": pieces.restart, "world_size": pieces.world_size},
    }


_PLAIN = (bool, int, float, str, bytes, type(None))


def local(value: Any, depth: int = 0) -> Any:
    """``value`` with tensors on the CPU (DTensors as this rank's shard), numpy values as torch
    or Python ones, and anything else that ``weights_only`` cannot load as its type's name."""
    if isinstance(value, torch.Tensor):
        to_local = getattr(value, "to_local", None)  # a DTensor: this rank's shard only
        tensor = to_local() if callable(to_local) else value
        return tensor.detach().cpu()
    if type(value) in _PLAIN:
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.array(value)) if value.dtype.kind in "biuf" else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if depth < 32 and isinstance(value, Mapping):
        return {_key(k): local(v, depth + 1) for k, v in value.items()}
    if depth < 32 and isinstance(value, (list, tuple)):
        items = [local(v, depth + 1) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _key(key: Any) -> Any:
    return key if type(key) in _PLAIN else str(key)
