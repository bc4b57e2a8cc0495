import pytest

from paratrain.errors import ConfigError
from paratrain.topology import Topology, first_host


def test_single_process_without_launcher() -> None:
    topo = Topology.from_env({})
    assert (topo.rank, topo.world_size, topo.source, topo.is_main) == (0, 1, "none", True)


def test_torchrun_variables() -> None:
    env = {
        "RANK": "9",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "16",
        "LOCAL_WORLD_SIZE": "8",
        "MASTER_ADDR": "node1",
        "MASTER_PORT": "1234",
    }
    topo = Topology.from_env(env)
    assert (topo.rank, topo.local_rank, topo.world_size, topo.local_world_size) == (9, 1, 16, 8)
    assert (topo.master_addr, topo.master_port, topo.source) == ("node1", 1234, "torchrun")
    assert topo.distributed and not topo.is_main


def test_slurm_variables_pick_first_host_and_local_rank() -> None:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "8",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS_PER_NODE": "4(x2)",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_JOB_ID": "123456",
    }
    topo = Topology.from_env(env)
    assert (topo.rank, topo.local_rank, topo.world_size, topo.local_world_size) == (5, 1, 8, 4)
    assert topo.master_addr == "gpu07" and topo.source == "slurm"
    assert topo.master_port == 20000 + 123456 % 10000


def test_torchrun_wins_over_slurm() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}
    assert Topology.from_env(env).source == "torchrun"


@pytest.mark.parametrize(
    "nodelist,host",
    [("node1", "node1"), ("a[1-3],b2", "a1"), ("gpu[003,007-009]", "gpu003"), ("x[2-3]y,z", "x2y")],
)
def test_first_host(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


@pytest.mark.parametrize(
    "env,needle",
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "outside world size 2"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ],
)
def test_bad_variables_explain_the_fix(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as err:
        Topology.from_env(env)
    assert "paratrain run" in str(err.value)
