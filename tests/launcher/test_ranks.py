"""The one rank spawner: values in rank order, a dead or hung rank named fast, the root cause."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from paratrain.distributed.ranks import (
    Failure,
    FileGroup,
    RankFailedError,
    describe_exit,
    root_cause,
    spawn_ranks,
)

pytestmark = pytest.mark.dist


def _sum_of_ranks() -> tuple[int, float, str]:
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_rank(), float(t), os.environ.get("RANK", "unset")


def _rank_from_env() -> tuple[str, str, str, str]:
    env = os.environ
    return env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]


def _one_rank_dies(how: str) -> None:
    if os.environ["RANK"] == "1":
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # rank 0 would wait for its peer much longer than this test may take


def _sleep_and_note_pid(folder: str) -> None:
    Path(folder, f"{os.getpid()}.pid").touch()
    time.sleep(60)


def _rank_one_raises() -> None:
    if dist.get_rank() == 1:
        raise ValueError("bad batch on rank 1")
    dist.all_reduce(torch.ones(1))  # rank 0 then fails only because its peer went away


def test_values_come_back_in_rank_order_over_a_file_group() -> None:
    values = spawn_ranks(_sum_of_ranks, 2, start_method="fork", group=FileGroup(), threads=1)
    assert values == [(0, 3.0, "unset"), (1, 3.0, "unset")]


def test_env_rendezvous_and_only_the_main_result() -> None:
    values = spawn_ranks(_rank_from_env, 3, start_method="fork", results="main")
    assert values == [("0", "0", "3", "127.0.0.1"), None, None]


@pytest.mark.parametrize(
    "how,needle,code", [("exit", "exited with code 3", 3), ("kill", "killed by SIGKILL", -9)]
)
def test_a_rank_that_dies_without_raising_is_named_within_seconds(
    how: str, needle: str, code: int
) -> None:
    started = time.monotonic()
    with pytest.raises(RankFailedError) as err:
        spawn_ranks(_one_rank_dies, 2, (how,), start_method="fork", timeout_s=120)
    assert time.monotonic() - started < 5
    assert err.value.rank == 1 and err.value.exitcode == code
    assert str(err.value).startswith("rank 1 failed") and needle in str(err.value)


def test_hung_ranks_are_killed_and_named(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank\(s\) 0, 1 gave no result within 1s"):
        spawn_ranks(_sleep_and_note_pid, 2, (str(tmp_path),), start_method="fork", timeout_s=1)
    assert time.monotonic() - started < 5
    pids = [int(p.stem) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_the_rank_that_failed_on_its_own_is_blamed() -> None:
    with pytest.raises(RankFailedError) as err:
        spawn_ranks(_rank_one_raises, 2, start_method="fork", group=FileGroup(timeout_s=20))
    assert err.value.rank == 1 and "bad batch on rank 1" in str(err.value)


def test_root_cause_and_exit_descriptions() -> None:
    peer_gone = Failure(0, "RuntimeError: Connection closed by peer [127.0.0.1]:1234", None, True)
    own = Failure(1, "ValueError: bad batch", None, False)
    died = Failure(2, "its process was killed by SIGKILL", -9, False)
    assert root_cause([peer_gone, own, died]) is own
    assert root_cause([peer_gone, died]) is died
    assert root_cause([peer_gone]) is peer_gone
    assert describe_exit(-signal.SIGSEGV).startswith("was killed by SIGSEGV")
    assert "out-of-memory" in describe_exit(-signal.SIGKILL)
    assert describe_exit(1) == "exited with code 1"
