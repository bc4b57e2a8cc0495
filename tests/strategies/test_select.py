import pytest
import torch

from paratrain.config import RunConfig
from paratrain.distributed.topology import Topology
from paratrain.errors import ConfigError, EnvironmentMismatchError
from paratrain.strategies import STRATEGY_NAMES, select_strategy


def topo(world: int = 1, local_world: int | None = None, rank: int = 0) -> Topology:
    return Topology(
        rank=rank,
        local_rank=rank % (local_world or world),
        world_size=world,
        local_world_size=local_world or world,
        master_addr="127.0.0.1",
        master_port=29500,
        source="torchrun" if world > 1 else "none",
    )


def test_auto_picks_cpu_single_and_ddp_and_says_why() -> None:
    cfg = RunConfig()
    cpu = select_strategy(cfg, topo(), gpus=0)
    assert cpu.strategy.name == "cpu" and "no GPU" in cpu.reason
    ddp = select_strategy(cfg, topo(world=2), gpus=0)
    assert (ddp.strategy.name, ddp.backend, ddp.strategy.device) == (
        "ddp",
        "gloo",
        torch.device("cpu"),
    )
    assert "2 ranks" in ddp.reason
    single = select_strategy(cfg, topo(), gpus=4)
    assert single.strategy.name == "single" and "--nproc 4" in single.reason


def test_strategy_cpu_trains_on_the_cpu_where_gpus_are_visible() -> None:
    cpu = select_strategy(RunConfig(strategy="cpu"), topo(), gpus=2)
    assert (cpu.strategy.device, cpu.backend) == (torch.device("cpu"), "gloo")
    with pytest.raises(ConfigError, match="strategy='single'"):
        select_strategy(RunConfig(strategy="cpu", accelerator="cuda"), topo(), gpus=2)


def test_gpu_is_chosen_by_local_rank() -> None:
    sel = select_strategy(RunConfig(strategy="ddp"), topo(world=16, local_world=8, rank=9), gpus=8)
    assert sel.strategy.device == torch.device("cuda", 1) and sel.backend == "nccl"


def test_unknown_strategy_lists_the_names() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig(strategy="deepspeed")
    for name in STRATEGY_NAMES:
        assert name in str(err.value)


@pytest.mark.parametrize(
    "settings,needle",
    [
        (dict(accelerator="cuda"), "accelerator='cuda' needs CUDA GPUs"),
        (dict(strategy="dp"), "strategy 'dp' needs CUDA GPUs"),
        (dict(strategy="single"), "strategy 'single' needs CUDA GPUs"),
        (dict(strategy="ddp", backend="nccl"), "backend 'nccl' needs CUDA GPUs"),
    ],
)
def test_gpu_only_requests_on_a_cpu_machine_name_the_fix(
    settings: dict[str, str], needle: str
) -> None:
    with pytest.raises(EnvironmentMismatchError, match=needle) as err:
        select_strategy(RunConfig(**settings), topo(), gpus=0)
    assert "paratrain doctor" in str(err.value)


def test_more_ranks_per_machine_than_gpus() -> None:
    with pytest.raises(EnvironmentMismatchError, match="4 ranks on this machine but only 2") as e:
        select_strategy(RunConfig(strategy="ddp"), topo(world=4), gpus=2)
    assert "--nproc 2" in str(e.value)


@pytest.mark.parametrize("strategy,gpus", [("dp", 2), ("single", 1), ("cpu", 0)])
def test_sync_batchnorm_needs_a_process_group(strategy: str, gpus: int) -> None:
    with pytest.raises(ConfigError, match="sync_batchnorm=True with strategy") as err:
        select_strategy(RunConfig(strategy=strategy, sync_batchnorm=True), topo(), gpus=gpus)
    assert "ddp" in str(err.value)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "tp", "pipeline"])
def test_sync_batchnorm_on_cpu_ranks_is_refused_before_the_first_forward(strategy: str) -> None:
    config = RunConfig(strategy=strategy, sync_batchnorm=True)
    with pytest.raises(ConfigError, match=f"CPU ranks \\(strategy '{strategy}'\\).*GPUs only"):
        select_strategy(config, topo(world=2), gpus=0)


def test_broadcast_buffers_is_a_ddp_option() -> None:
    with pytest.raises(ConfigError, match=r"broadcast_buffers is a 'ddp' option.*'cpu'"):
        select_strategy(RunConfig(strategy="cpu", broadcast_buffers=False), topo(), gpus=0)
    chosen = select_strategy(RunConfig(strategy="ddp", broadcast_buffers=False), topo(2), gpus=0)
    assert chosen.strategy.name == "ddp"


@pytest.mark.parametrize("value", [1e-9, 0.5, 0])
def test_a_timeout_no_collective_can_meet_is_refused(value: float) -> None:
    with pytest.raises(ConfigError, match=r"timeout_s must be a number at least 1 .*no collective"):
        RunConfig(timeout_s=value)
    assert RunConfig(timeout_s=1).timeout_s == 1


@pytest.mark.parametrize("strategy", ["cpu", "single", "dp"])
def test_one_process_strategies_refuse_several_ranks(strategy: str) -> None:
    with pytest.raises(ConfigError, match="runs in one process, but this job has 2 ranks"):
        select_strategy(RunConfig(strategy=strategy), topo(world=2), gpus=2)


def test_dp_device_ids_must_exist() -> None:
    with pytest.raises(EnvironmentMismatchError, match="only 2 are visible"):
        select_strategy(RunConfig(strategy="dp", device_ids=[0, 3]), topo(), gpus=2)
