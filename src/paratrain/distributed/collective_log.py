"""Every rank's record of its collectives: which one it is in, and the last it finished.

    log = CollectiveLog(rank=0).install()     # wraps torch.distributed's collectives
    ...                                         # dist.all_reduce(t) -> seq 57, "all_reduce", ...
    log.state()                                 # {"seq": 57, "inside": True, ...}
    log.uninstall()

A call from the main thread to a collective of ``torch.distributed`` (FSDP's gathers included;
DDP's bucket all-reduces run in C++ and are not seen: those ranks are "in backward") gets the
next sequence number, its op, the shapes and dtypes of its tensors, its process group's size and
the script's line that issued it. Only the outermost call is recorded (``all_gather_object``
calls ``all_gather`` inside). The cost is a few microseconds a call; nothing is sent anywhere:
the watchdog publishes :meth:`CollectiveLog.state` every few seconds and compares the ranks'
states when they stop making progress (:mod:`paratrain.distributed.stall`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from paratrain.distributed.watchdog import CodeRoots

OPS = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "monitored_barrier",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
)


@dataclass
class Entry:
    """One collective call."""

    seq: int
    op: str
    shapes: str
    """``f32[1024, 4096]``; several tensors joined by ``, `` (at most 3 shown)."""
    group: int
    """The size of its process group."""
    group_name: str
    """Its process group's name (``default`` for the job's)."""
    where: str
    """``train.py:88``: the innermost line of the script's own code that led to it."""
    started: float
    """``time.monotonic()`` when it was called."""


_DTYPES = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.uint8: "u8",
    torch.bool: "bool",
}


def _describe(value: Any) -> list[str]:
    if isinstance(value, torch.Tensor):
        return [f"{_DTYPES.get(value.dtype, str(value.dtype))}{list(value.shape)}"]
    if isinstance(value, (list, tuple)):
        return [d for item in value[:3] for d in _describe(item)]
    return []


class CollectiveLog:
    """See the module docstring."""

    def __init__(self, rank: int, roots: CodeRoots | None = None) -> None:
        self.rank = rank
        self.seq = 0
        self.current: Entry | None = None
        """The collective the main thread is in, or None."""
        self.last: Entry | None = None
        """The last one it finished."""
        self.finished_at = time.monotonic()
        self._roots = roots or CodeRoots.here()
        self._inside = threading.local()
        self._main = threading.main_thread()
        self._originals: dict[str, Callable[..., Any]] = {}
        self._kinds: dict[str, bool] = {}  # file name -> is the script's own code (cached)

    def install(self) -> CollectiveLog:
        """Wrap ``torch.distributed``'s collectives (idempotent); returns self."""
        for name in OPS:
            original = getattr(dist, name, None)
            if original is None or name in self._originals:
                continue
            self._originals[name] = original
            setattr(dist, name, self._wrap(name, original))
        return self

    def uninstall(self) -> None:
        """Put torch's own functions back."""
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals.clear()

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def collective(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._inside, "depth", 0) or threading.current_thread() is not self._main:
                return original(*args, **kwargs)
            self.seq += 1
            shapes = [d for v in (*args, *kwargs.values()) for d in _describe(v)]
            group = kwargs.get("group")
            size = dist.get_world_size(group) if dist.is_initialized() else 1
            label = str(getattr(group, "group_name", "default")) if group is not None else "default"
            self.current = Entry(
                self.seq, name, ", ".join(shapes[:3]), size, label, self._caller(), time.monotonic()
            )
            self._inside.depth = 1
            try:
                return original(*args, **kwargs)
            finally:
                self._inside.depth = 0
                self.last, self.current = self.current, None
                self.finished_at = time.monotonic()

        collective.__name__ = collective.__qualname__ = name
        collective.__doc__ = original.__doc__
        collective.__wrapped__ = original  # type: ignore[attr-defined]
        return collective

    def _caller(self) -> str:
        """``train.py:88`` of the innermost frame of the script's own code, else the innermost."""
        frame = sys._getframe(2)
        first = frame
        while frame is not None:
            name = frame.f_code.co_filename
            mine = self._kinds.get(name)
            if mine is None:
                mine = self._kinds[name] = self._roots.kind(name) == "user"
            if mine:
                return f"{name.rsplit('/', 1)[-1]}:{frame.f_lineno}"
            frame = frame.f_back  # type: ignore[assignment]
        return f"{first.f_code.co_filename.rsplit('/', 1)[-1]}:{first.f_lineno}"

    def state(self) -> dict[str, Any]:
        """What the watchdog publishes: the collective the rank is in (or its last one)."""
        entry = self.current or self.last
        since = (
            entry.started if self.current is not None and entry is not None else self.finished_at
        )
        return {
            "seq": self.seq,
            "inside": self.current is not None,
            "collective": asdict(entry) if entry is not None else None,
            "since_s": round(time.monotonic() - since, 1),
        }
