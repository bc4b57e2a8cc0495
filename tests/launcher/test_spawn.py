"""``paratrain.launch``: a function on N local ranks, its result, a failing or dying rank named."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import paratrain as pt
from paratrain.distributed.spawn import RankFailedError, start_method
from paratrain.errors import ConfigError

pytestmark = pytest.mark.dist


def _train_and_report(scale: float) -> dict[str, object]:
    with pt.Run(strategy="ddp", progress=False, stats_every=None) as run:
        value = run.reduce(torch.tensor([float(run.rank + 1)]), "sum") * scale
        return {
            "rank": run.rank,
            "world": run.world_size,
            "source": run.topology.source,
            "sum": float(value),
        }


def _fail_on_rank_one() -> None:
    with pt.Run(strategy="ddp", progress=False, stats_every=None) as run:
        if run.rank == 1:
            raise ValueError("bad batch on rank 1")
        run.barrier()


def test_launch_returns_rank_zero_result() -> None:
    result = pt.launch(_train_and_report, nproc=2, args=(10.0,))
    assert result == {"rank": 0, "world": 2, "source": "torchrun", "sum": 30.0}


def test_a_failing_rank_is_named() -> None:
    with pytest.raises(RankFailedError, match="rank 1 failed") as err:
        pt.launch(_fail_on_rank_one, nproc=2, timeout_s=120)
    assert "bad batch on rank 1" in str(err.value) and err.value.rank == 1


def _rank_one_dies(how: str) -> None:
    if os.environ["RANK"] == "1":
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)  # rank 0 waits far longer than the test allows


@pytest.mark.parametrize("how,needle", [("exit", "exited with code 3"), ("kill", "SIGKILL")])
def test_a_rank_that_dies_without_raising_is_named_at_once(how: str, needle: str) -> None:
    started = time.monotonic()
    with pytest.raises(RankFailedError) as err:
        pt.launch(_rank_one_dies, nproc=2, args=(how,))  # the default timeout is 600 s
    assert time.monotonic() - started < 15
    assert err.value.rank == 1 and str(err.value).startswith("rank 1 failed")
    assert needle in str(err.value)


STDIN_SCRIPT = """
import os
import torch
import torch.distributed as dist
import paratrain

def total(scale):
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return float(t) * scale, os.environ["WORLD_SIZE"]

print("result", paratrain.launch(total, nproc=2, args=(10.0,), timeout_s=60))
"""


def test_a_script_fed_on_stdin_runs_its_ranks() -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-"], input=STDIN_SCRIPT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "result (30.0, '2')" in proc.stdout
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"nproc": 0}, "nproc=0"),
        ({"nproc": True}, "nproc=True"),
        ({"nproc": 2.0}, "nproc=2.0"),
        ({"nproc": "2"}, "nproc='2'"),
        ({"timeout_s": 0}, "timeout_s=0"),
        ({"timeout_s": -1.0}, "timeout_s=-1.0"),
        ({"timeout_s": math.inf}, "timeout_s=inf"),
        ({"timeout_s": math.nan}, "timeout_s=nan"),
        ({"timeout_s": True}, "timeout_s=True"),
        ({"timeout_s": "60"}, "timeout_s='60'"),
    ],
)
def test_bad_nproc_or_timeout_names_the_fix(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)) as err:
        pt.launch(_rank_one_dies, **kwargs)
    assert "Pass e.g." in str(err.value)


def _defined_in_main() -> None: ...


_defined_in_main.__module__ = "__main__"


@pytest.mark.parametrize(
    "main,fn,method",
    [
        ({"__spec__": object(), "__file__": "/x/mod.py"}, _defined_in_main, "spawn"),  # -m
        ({"__spec__": None, "__file__": __file__}, _defined_in_main, "spawn"),  # a script
        ({"__spec__": None}, _rank_one_dies, "spawn"),  # notebook, function from a module
        ({"__spec__": None}, _defined_in_main, "fork"),  # notebook / -c, function defined there
        ({"__spec__": None, "__file__": "<stdin>"}, _rank_one_dies, "fork"),  # python - <<EOF
    ],
)
def test_start_method(
    monkeypatch: pytest.MonkeyPatch, main: dict[str, Any], fn: Any, method: str
) -> None:
    monkeypatch.setitem(sys.modules, "__main__", SimpleNamespace(**main))
    assert start_method(fn) == method


def test_fork_after_cuda_was_initialised_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "__main__", SimpleNamespace(__spec__=None, __file__="<stdin>"))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(ConfigError, match=r"Move the function into a \.py file"):
        start_method(_rank_one_dies)


def _returns_a_lock() -> Any:
    import threading

    return threading.Lock()


def _add(a: int, b: int) -> int:
    return a + b


@pytest.mark.parametrize(
    "call,needle",
    [
        (lambda: pt.launch(5, 2), "fn must be a function"),  # type: ignore[arg-type]
        (lambda: pt.launch(_add, 2, [1, 2]), "args must be a tuple"),  # type: ignore[arg-type]
        (lambda: pt.launch(lambda: 1, 2), "fn cannot be sent to the ranks"),
        (lambda: pt.launch(_add, 2, (math.inf, object)), None),
        (lambda: pt.launch(_add, 2, (__import__("threading").Lock(), 1)), "args cannot be sent"),
    ],
)
def test_what_cannot_reach_the_ranks_is_named_before_they_start(call: Any, needle: str) -> None:
    if needle is None:  # picklable arguments are not refused up front (the rank raises)
        with pytest.raises(RankFailedError):
            call()
        return
    with pytest.raises(ConfigError, match=needle):
        call()


def test_a_return_value_that_cannot_come_back_is_named() -> None:
    with pytest.raises(RankFailedError, match="cannot be sent back"):
        pt.launch(_returns_a_lock, 1)
