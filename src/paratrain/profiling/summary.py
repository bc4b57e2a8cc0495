"""Where a step's time goes, from a ``torch.profiler`` trace: compute, communication, data, ...

    summary = summarize(json.loads(Path("rank0.steps-7-9.pt.trace.json").read_text()))
    summary.step_ms                       # mean wall time of a profiled step
    summary.parts_ms                      # {"compute": .., "communication": .., "data wait": ..,
                                          #  "optimizer": .., "idle": ..}: they add up to step_ms
    print(render([summary, ...]))         # the table the main process prints, one row per rank

Each instant of a step (a ``ProfilerStep#N`` span of the trace) gets exactly one label, so the
parts add up to the step:

- **CPU training** (no GPU kernels in the trace): the main thread in the DataLoader's
  ``__next__`` or paratrain's copy of the batch to the device is *data wait*; in
  ``Optimizer.step``/``zero_grad`` *optimizer*; in a collective (gloo, nccl, ``c10d``)
  *communication*; in any other op *compute*. When the main thread runs no op while a collective
  runs on another thread (gloo's workers), that time is *communication* too: the step waits for
  it. What is left is *idle* (Python between ops, waiting on other ranks outside collectives).
- **GPU training** (kernels in the trace): the device's view. A compute kernel running is
  *compute* (*optimizer* when it was launched from ``Optimizer.step``); only communication kernels
  running is *communication* (not hidden behind compute); no kernel running while the main thread
  waits for data is *data wait*, while it runs the optimizer's Python *optimizer*; else *idle*
  (launch overhead, synchronisation, the host being slow).

Communication that overlaps compute is reported on its own (``overlapped_communication_ms``):
that part costs nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PARTS = ("compute", "communication", "data wait", "optimizer", "idle")
"""The labels of a step's time, in the order they are printed."""

_DATA = ("enumerate(DataLoader)", "paratrain: batch to device")
_OPTIMIZER = ("Optimizer.step#", "Optimizer.zero_grad#")
_COMMUNICATION = ("gloo:", "nccl:", "c10d::", "record_param_comms", "mpi:")
_COMM_KERNELS = ("nccl",)
_KERNEL_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass(frozen=True, slots=True)
class Summary:
    """The time of one rank's profiled steps, per step (milliseconds)."""

    rank: int
    first_step: int
    last_step: int
    device: str
    """``cpu`` (the main thread's view) or ``cuda`` (the GPU's view)."""
    step_ms: float
    parts_ms: dict[str, float] = field(default_factory=dict)
    overlapped_communication_ms: float = 0.0

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "steps": [self.first_step, self.last_step],
            "device": self.device,
            "step_ms": self.step_ms,
            "parts_ms": self.parts_ms,
            "overlapped_communication_ms": self.overlapped_communication_ms,
        }


def summarize(trace: Mapping[str, Any], *, rank: int = 0) -> Summary:
    """The summary of a chrome trace as ``torch.profiler`` exports it (``export_chrome_trace``)."""
    events = [e for e in trace.get("traceEvents", ()) if e.get("ph") == "X" and "dur" in e]
    steps = sorted(
        (e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")),
        key=lambda e: float(e["ts"]),
    )
    if not steps:
        raise ValueError("the trace holds no ProfilerStep# spans (was profiler.step() called?)")
    main = steps[0]["tid"]
    kernels = [e for e in events if e.get("cat") in _KERNEL_CATEGORIES]
    gpu = bool(kernels)
    labelled = _gpu_labels(events, kernels, main) if gpu else _cpu_labels(events, main)
    comm = [(s, e) for label, s, e in labelled if label == "communication"]
    totals = dict.fromkeys(PARTS, 0.0)
    overlapped = 0.0
    for step in steps:
        start, end = float(step["ts"]), float(step["ts"]) + float(step["dur"])
        parts = _partition(labelled, start, end)
        for label, length in parts.items():
            totals[label] += length
        overlapped += _covered(comm, start, end) - parts["communication"]
    numbers = [int(str(s["name"]).split("#", 1)[1]) for s in steps]
    count = len(steps)
    return Summary(
        rank=rank,
        first_step=min(numbers),
        last_step=max(numbers),
        device="cuda" if gpu else "cpu",
        step_ms=sum(float(s["dur"]) for s in steps) / count / 1000,
        parts_ms={k: v / count / 1000 for k, v in totals.items()},
        overlapped_communication_ms=max(0.0, overlapped) / count / 1000,
    )


Labelled = list[tuple[str, float, float]]
"""(label, start µs, end µs), earlier labels in a list winning over later ones at one instant."""


def _starts(name: str, prefixes: Sequence[str]) -> bool:
    return any(name.startswith(p) for p in prefixes)


def _cpu_labels(events: Iterable[Mapping[str, Any]], main: object) -> Labelled:
    data: Labelled = []
    optimizer: Labelled = []
    comm_main: Labelled = []
    compute: Labelled = []
    comm_elsewhere: Labelled = []
    for e in events:
        name = str(e.get("name", ""))
        if name.startswith("ProfilerStep#") or e.get("cat") not in ("cpu_op", "user_annotation"):
            continue
        span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        if e.get("tid") != main:
            if _starts(name, _COMMUNICATION):
                comm_elsewhere.append(("communication", *span))
        elif _starts(name, _DATA):
            data.append(("data wait", *span))
        elif _starts(name, _OPTIMIZER):
            optimizer.append(("optimizer", *span))
        elif _starts(name, _COMMUNICATION):
            comm_main.append(("communication", *span))
        else:
            compute.append(("compute", *span))
    return data + optimizer + comm_main + compute + comm_elsewhere


def _gpu_labels(
    events: Sequence[Mapping[str, Any]], kernels: Sequence[Mapping[str, Any]], main: object
) -> Labelled:
    def on_main(prefixes: Sequence[str]) -> list[tuple[float, float]]:
        return [
            (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            for e in events
            if e.get("tid") == main and _starts(str(e.get("name", "")), prefixes)
        ]

    optimizer_spans = on_main(_OPTIMIZER)
    launched_in_optimizer = {
        e.get("args", {}).get("correlation")
        for e in events
        if e.get("cat") == "cuda_runtime" and _inside(float(e["ts"]), optimizer_spans)
    }
    compute: Labelled = []
    optimizer: Labelled = []
    comm: Labelled = []
    for k in kernels:
        span = (float(k["ts"]), float(k["ts"]) + float(k["dur"]))
        name = str(k.get("name", "")).lower()
        if any(c in name for c in _COMM_KERNELS):
            comm.append(("communication", *span))
        elif k.get("args", {}).get("correlation") in launched_in_optimizer:
            optimizer.append(("optimizer", *span))
        else:
            compute.append(("compute", *span))
    host: Labelled = [("data wait", s, e) for s, e in on_main(_DATA)]
    host += [("optimizer", s, e) for s, e in optimizer_spans]
    return optimizer + compute + comm + host


def _inside(t: float, spans: Sequence[tuple[float, float]]) -> bool:
    return any(s <= t < e for s, e in spans)


def _partition(labelled: Labelled, start: float, end: float) -> dict[str, float]:
    """How long each label holds within [start, end): at each instant the first label of
    ``labelled`` (by list position) that covers it; ``idle`` where none does."""
    out = dict.fromkeys(PARTS, 0.0)
    bounds: list[tuple[float, int, int]] = []  # (time, +1 open / -1 close, priority)
    for priority, (_, s, e) in enumerate(labelled):
        s, e = max(s, start), min(e, end)
        if e > s:
            bounds += [(s, 1, priority), (e, -1, priority)]
    bounds.sort()
    open_heap: list[int] = []
    closed: dict[int, int] = {}
    at = start
    for t, kind, priority in bounds:
        while open_heap and closed.get(open_heap[0], 0):
            closed[open_heap[0]] -= 1
            heapq.heappop(open_heap)
        label = labelled[open_heap[0]][0] if open_heap else "idle"
        out[label] += t - at
        at = t
        if kind == 1:
            heapq.heappush(open_heap, priority)
        else:
            closed[priority] = closed.get(priority, 0) + 1
    out["idle"] += end - at
    return out


def _covered(spans: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Length of the union of ``spans`` within [start, end)."""
    clipped = sorted((max(s, start), min(e, end)) for s, e in spans if min(e, end) > max(s, start))
    total, reach = 0.0, start
    for s, e in clipped:
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


_HINTS = {
    "data wait": "the loop waits for batches: more DataLoader workers (num_workers), "
    "pin_memory, or a cheaper __getitem__",
    "communication": "collectives the compute does not hide: a larger per-rank batch or "
    "grad_accum (fewer gradient syncs per sample), more n_microbatches for a pipeline (a "
    "smaller bubble), comm_hook='bf16' for ddp on nccl, or a faster interconnect",
    "optimizer": "the optimizer step: a fused or foreach optimizer (e.g. AdamW(fused=True))",
    "idle": "neither computing nor communicating (Python overhead, launch gaps, waiting on a "
    "slower rank): larger batches, torch.compile, or balance the ranks",
}


def render(summaries: Sequence[Summary]) -> str:
    """The per-rank table, and one line on the largest part that is not compute."""
    first = summaries[0]
    lines = [
        f"paratrain: profile of steps {first.first_step}-{first.last_step} "
        f"({first.steps} steps, {first.device} view), per step:",
        f"  {'rank':>4}  {'step ms':>8}  " + "  ".join(f"{p:>16}" for p in PARTS),
    ]
    for s in summaries:
        cells = [
            f"{s.parts_ms[p]:8.1f} {100 * s.parts_ms[p] / s.step_ms if s.step_ms else 0:5.1f} %"
            for p in PARTS
        ]
        lines.append(f"  {s.rank:>4}  {s.step_ms:8.1f}  " + "  ".join(f"{c:>16}" for c in cells))
    worst = max(
        ((s.parts_ms[p] / s.step_ms if s.step_ms else 0.0, p, s.rank) for s in summaries
         for p in PARTS if p != "compute"),
        default=(0.0, "", 0),
    )  # fmt: skip
    share, part, rank = worst
    if share >= 0.2:
        lines.append(
            f"  largest cost besides compute: {part}, {100 * share:.0f} % of rank {rank}'s "
            f"step — {_HINTS[part]}."
        )
    hidden = sum(s.overlapped_communication_ms for s in summaries) / len(summaries)
    if hidden >= 0.05:
        lines.append(f"  communication hidden behind compute: {hidden:.1f} ms per step per rank")
    return "\n".join(lines)
