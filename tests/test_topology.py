from pathlib import Path

import pytest

from paratrain.distributed.topology import Topology, first_host, slurm_rendezvous_port
from paratrain.errors import ConfigError


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


BARE = {"RANK": "5", "WORLD_SIZE": "8", "MASTER_PORT": "29500"}
"""What a launcher without torchrun sets (a Kubeflow PyTorchJob, a hand-rolled script)."""


@pytest.mark.parametrize(
    "extra,local_rank,local_world",
    [
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "node0"}, 1, 4),
        ({"LOCAL_RANK": "0", "MASTER_ADDR": "trainer-master-0"}, 0, 1),  # one process per pod
        ({"LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "node0"}, 1, 4),  # rank 5 % 4
        ({"LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1"}, 1, 2),
        ({"MASTER_ADDR": "127.0.0.1"}, 5, 8),  # loopback: every rank on this machine
        ({"MASTER_ADDR": "localhost"}, 5, 8),
        ({"MASTER_ADDR": "::1"}, 5, 8),
        ({}, 5, 8),  # no MASTER_ADDR: the rendezvous defaults to loopback
    ],
)
def test_local_rank_for_launchers_without_torchrun(
    extra: dict[str, str], local_rank: int, local_world: int
) -> None:
    topo = Topology.from_env({**BARE, **extra})
    assert (topo.rank, topo.local_rank, topo.local_world_size) == (5, local_rank, local_world)


@pytest.mark.parametrize("master", ["node0", "10.0.0.1", "trainer-master-0.svc"])
def test_several_machines_without_local_variables_name_the_fix(master: str) -> None:
    with pytest.raises(ConfigError) as err:
        Topology.from_env({**BARE, "MASTER_ADDR": master})
    message = str(err.value)
    assert "LOCAL_RANK" in message and "LOCAL_WORLD_SIZE" in message and master in message
    assert "torchrun" in message and "paratrain run" in message


def test_one_process_needs_no_local_variables() -> None:
    topo = Topology.from_env({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "node0"})
    assert (topo.local_rank, topo.local_world_size) == (0, 1)


def test_slurm_port_is_one_formula_for_run_and_topology(tmp_path: Path) -> None:
    from paratrain.commands.run.plan import RunOptions, make_plan

    env = {"SLURM_JOB_ID": "777123", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[1-2]"}
    script = tmp_path / "train.py"
    script.write_text("")
    plan = make_plan(RunOptions(target=[str(script)], nproc="1"), env=env, gpus=0)
    topo = Topology.from_env({**env, "SLURM_PROCID": "0", "SLURM_NTASKS": "2"})
    assert slurm_rendezvous_port(env) == 27123
    assert plan.endpoint == f"gpu1:{slurm_rendezvous_port(env)}"
    assert topo.master_port == slurm_rendezvous_port(env)


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
