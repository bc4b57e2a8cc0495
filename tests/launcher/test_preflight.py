"""The one pre-flight of ``paratrain demo`` and ``paratrain bench``: a rank's checks, up front."""

from __future__ import annotations

import pytest

from paratrain.commands.run.preflight import local_topology, preflight
from paratrain.config import RunConfig
from paratrain.errors import ConfigError, EnvironmentMismatchError


def test_selects_what_rank_zero_would() -> None:
    assert preflight(RunConfig(strategy="auto"), nproc=2, gpus=0).strategy.name == "ddp"
    assert preflight(RunConfig(strategy="auto"), nproc=1, gpus=0).strategy.name == "cpu"
    topo = local_topology(4)
    assert (topo.world_size, topo.local_world_size, topo.rank, topo.source) == (
        4, 4, 0, "torchrun"
    )  # fmt: skip


@pytest.mark.parametrize(
    "config,nproc,error,needle",
    [
        (RunConfig(strategy="cpu"), 2, ConfigError, "runs in one process"),
        (RunConfig(strategy="dp"), 1, EnvironmentMismatchError, "needs CUDA GPUs"),
        (RunConfig(strategy="single"), 1, EnvironmentMismatchError, "Use strategy=.cpu."),
    ],
)
def test_raises_what_a_rank_would_raise(
    config: RunConfig, nproc: int, error: type[Exception], needle: str
) -> None:
    with pytest.raises(error, match=needle):
        preflight(config, nproc=nproc, gpus=0)


def test_demo_and_bench_share_it() -> None:
    from paratrain.commands.bench.runner import make_plan

    with pytest.raises(ConfigError) as err:
        preflight(RunConfig(strategy="cpu"), nproc=2, gpus=0)
    plan = dict(make_plan(["cpu"], ["fp32"], [2]))
    assert next(iter(plan.values())) == str(err.value).split(". ")[0] + "."
