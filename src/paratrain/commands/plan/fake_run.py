"""Run a training script on fake tensors up to its first optimizer step, and write its plan.

    python -m paratrain.commands.plan.fake_run --out plan.json --nproc 4 [--accelerator cuda] \\
        -- train.py --lr 3e-4

What ``paratrain plan`` runs, one process. Tensors the script makes are fake (shapes and dtypes,
no memory), so a model of any size costs nothing. The data loader's indices and seeds are drawn
on real tensors (they are read as numbers), and a fake tensor read as a number gives a placeholder
(``.item()`` 1, an index 0, a truth value False). The JSON
holds the plan's rows, or ``error``: the operation a fake tensor cannot do (a NumPy conversion,
``nonzero`` before the first step) and the script's line that asked for it.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.utils.data.dataloader as dataloader

from paratrain.commands.plan.memory import checkpoint_second_step, plans, step_tracker
from paratrain.config import RunConfig
from paratrain.runtime import plan_probe as probe


def _real_indices() -> None:
    """Sampler indices and worker seeds are numbers the loader reads: draw them for real."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    get_iterator = dataloader.DataLoader._get_iterator
    next_index = dataloader._BaseDataLoaderIter._next_index

    def _get_iterator(self: Any) -> Any:
        with unset_fake_temporarily():
            return get_iterator(self)

    def _next_index(self: Any) -> Any:
        with unset_fake_temporarily():
            return next_index(self)  # type: ignore[no-untyped-call]

    dataloader.DataLoader._get_iterator = _get_iterator  # type: ignore[method-assign]
    dataloader._BaseDataLoaderIter._next_index = _next_index  # type: ignore[method-assign]


def _values_read_as_placeholders() -> None:
    """A fake tensor's value read as a number: ``.item()`` and ``float()`` give 1.0, ``int()`` 1,
    an index 0, a truth value False (a log line of every micro-batch, a clipped norm, a sampled
    offset or a rejection loop must not stop the plan; a plan measures memory, not values).
    A NumPy conversion or an op whose output shape depends on values still stops it, named."""
    from torch._subclasses.fake_tensor import FakeTensor

    def placeholder(name: str, value: Any) -> None:
        real = getattr(torch.Tensor, name)

        def read(self: torch.Tensor, *args: Any) -> Any:
            if isinstance(self, FakeTensor):
                if name == "item":
                    kind = self.dtype
                    return False if kind == torch.bool else 1.0 if self.is_floating_point() else 1
                return value
            return real(self, *args)

        setattr(torch.Tensor, name, read)

    for name, value in (("item", None), ("__float__", 1.0), ("__int__", 1), ("__index__", 0),
                        ("__bool__", False)):  # fmt: skip
        placeholder(name, value)


def _script_line(error: BaseException, script: Path) -> str:
    """``train.py:42: loss.item()``: the script's innermost frame of ``error``."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if Path(f.filename) == script]
    if not frames:
        return "(not in the script)"
    frame = frames[-1]
    return f"{script.name}:{frame.lineno}: {(frame.line or '').strip()}"


def plan_script(target: list[str], nproc: int, accelerator: str = "cpu") -> dict[str, Any]:
    """The plan of the script ``target[0]`` run with arguments ``target[1:]`` (see the module
    docstring), for ranks on ``accelerator`` (``cuda``: a row for ``fsdp_offload`` too)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    script = Path(target[0]).resolve()
    started = time.perf_counter()
    _real_indices()
    _values_read_as_placeholders()
    tracker = step_tracker()
    with tempfile.TemporaryDirectory(prefix="paratrain-plan-") as run_dir:
        probe.ACTIVE = active = probe.Probe(tracker, run_dir, checkpoint_second_step)
        sys.argv = [str(script), *target[1:]]
        sys.path.insert(0, str(script.parent))
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        with fake:
            try:
                with tracker:
                    runpy.run_path(str(script), run_name="__main__")
            except probe.PlanComplete:
                pass
            except Exception as error:  # the script's own failure on fake tensors
                first = str(error).splitlines()[0] if str(error) else ""
                return {
                    "error": f"{type(error).__name__}: {first}",
                    "where": _script_line(error, script),
                }
            else:  # the script ended: fine after its first step (no second one to measure)
                if not active.captured.step:
                    return {"error": "the script ended before its first optimizer step (run.step)"}
                active.captured.checkpointed = []
            captured = active.captured
            config = active.settings or RunConfig()
            rows = plans(captured, world=nproc, config=config, accelerator=accelerator)
    params = sum(p.numel() for p in captured.model.parameters()) if captured.model else 0
    return {
        "script": str(script),
        "nproc": nproc,
        "parameters": params,
        "rows": [row.to_json() for row in rows],
        "seconds": round(time.perf_counter() - started, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paratrain.commands.plan.fake_run")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--nproc", required=True, type=int)
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    torch.set_num_threads(1)
    result = plan_script(target, args.nproc, args.accelerator)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
