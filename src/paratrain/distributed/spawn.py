"""``paratrain.launch``: run a function on N local ranks, from a script, a test or Jupyter.

    def train(lr: float) -> float:
        with pt.Run(strategy="ddp") as run:      # topology comes from the launcher
            ...
            return final_loss

    loss = paratrain.launch(train, nproc=2, args=(3e-4,))   # rank 0's return value

Each rank is a fresh process with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT set (a free
loopback port), so the function body is the same as under torchrun. A rank that raises, or dies
without raising (``os._exit``, SIGKILL, the OOM killer), ends the launch within about a second
with :class:`RankFailedError` naming the rank and carrying its traceback or its exit code or
signal. Ranks are spawned; where a spawned process could not re-create the function (defined in
a notebook or in ``python -c``, or a script fed on stdin: ``python - <<EOF``) they are forked
instead, which works on CPU as long as this process has not initialised CUDA (the error says so
when it has).
"""

from __future__ import annotations

import math
import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

from paratrain.distributed.ranks import RankFailedError, spawn_ranks
from paratrain.errors import ConfigError

__all__ = ["RankFailedError", "launch", "start_method"]


def start_method(fn: Callable[..., Any]) -> str:
    """``spawn``, or ``fork`` where a spawned rank could not re-create ``fn``.

    A spawned process re-imports ``__main__`` (from its module spec, else from its file) and
    then ``fn`` by module and name: a script read from stdin has no file to re-run, and a
    function defined in a notebook or ``python -c`` has no module to import it from.
    """
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    rerunnable = getattr(main, "__spec__", None) is not None or (
        main_file is not None and os.path.isfile(main_file)
    )
    if rerunnable or (main_file is None and fn.__module__ != "__main__"):
        return "spawn"
    torch = sys.modules.get("torch")  # not imported here: CUDA cannot be initialised
    if torch is not None and torch.cuda.is_initialized():
        where = "on stdin" if main_file is not None else "in this notebook (or python -c)"
        raise ConfigError(
            f"paratrain.launch got {fn.__qualname__!r}, defined {where}; its ranks can only be "
            "forked, and CUDA does not work in a forked process once this process has "
            "initialised it. Move the function into a .py file and import it (or run the "
            "script as a file), or call launch before touching CUDA (restart the kernel)."
        )
    return "fork"


def _check(nproc: object, timeout_s: object) -> None:
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ConfigError(
            f"launch(nproc={nproc!r}): nproc is the number of ranks, a whole number >= 1. Pass "
            "e.g. nproc=2."
        )
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, (int, float))
        or not math.isfinite(timeout_s)
        or timeout_s <= 0
    ):
        raise ConfigError(
            f"launch(timeout_s={timeout_s!r}): timeout_s is how long to wait for the ranks, a "
            "finite number of seconds > 0. Pass e.g. timeout_s=600."
        )


def _check_sendable(fn: object, args: object, method: str) -> None:
    """What the ranks must receive has to travel to them (spawned processes unpickle it)."""
    if not callable(fn):
        raise ConfigError(
            f"launch(fn={fn!r}): fn must be a function, e.g. launch(train, nproc=2, args=(lr,))."
        )
    if not isinstance(args, tuple):
        raise ConfigError(f"launch(args={args!r}): args must be a tuple, e.g. args=(3e-4,).")
    if method != "spawn":
        return  # forked ranks inherit fn and args
    for what, value in (("fn", fn), ("args", args)):
        try:
            pickle.dumps(value)
        except Exception as err:
            raise ConfigError(
                f"launch: {what} cannot be sent to the ranks ({err}). Define fn at module level "
                "of an importable file (not a lambda or a nested function), and pass plain "
                "values in args (numbers, strings, tensors; no locks, open files or lambdas)."
            ) from None


def launch(
    fn: Callable[..., Any], nproc: int = 2, args: tuple[Any, ...] = (), *, timeout_s: float = 600.0
) -> Any:
    """Run ``fn(*args)`` on ``nproc`` local ranks; return rank 0's result.

    Raises :class:`RankFailedError` for the rank that raised or died first (a rank that failed
    only because a peer went away is not blamed), or for ranks still running after
    ``timeout_s`` seconds (they are killed).
    """
    _check(nproc, timeout_s)
    method = start_method(fn) if callable(fn) else "spawn"
    _check_sendable(fn, args, method)
    values = spawn_ranks(fn, nproc, args, start_method=method, timeout_s=timeout_s, results="main")
    return values[0]
