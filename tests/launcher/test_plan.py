"""``paratrain run`` planning: torchrun command lines, Slurm, and errors that name the fix."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest

from paratrain.commands.run.failure import failure_message, failure_summary, reported_run_dir
from paratrain.commands.run.plan import RunOptions, make_plan
from paratrain.errors import ConfigError, EnvironmentMismatchError


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def test_single_node_cpu(script: Path) -> None:
    plan = make_plan(RunOptions(target=[str(script), "--lr", "3"], nproc="2"), env={}, gpus=0)
    assert plan.argv[1:4] == ["-m", "torch.distributed.run", "--nproc-per-node=2"]
    assert "--standalone" in plan.argv and plan.argv[-3:] == [str(script), "--lr", "3"]
    assert plan.backend == "gloo" and "2 rank(s)" in plan.describe()


def test_run_dir_and_report_reach_the_ranks_only_when_given(script: Path, tmp_path: Path) -> None:
    plain = make_plan(RunOptions(target=[str(script)], nproc="1"), env={}, gpus=0)
    assert set(plain.env) == {"OMP_NUM_THREADS"}  # the script's run_dir= (or default) decides
    given = RunOptions(
        target=[str(script)], nproc="1", run_dir=tmp_path / "exp", report=tmp_path / "r.json"
    )
    env = make_plan(given, env={"OMP_NUM_THREADS": "4"}, gpus=0).env
    assert env["PARATRAIN_RUN_DIR"] == str(tmp_path / "exp")
    assert env["PARATRAIN_REPORT"] == str(tmp_path / "r.json") and env["OMP_NUM_THREADS"] == "4"


def test_auto_nproc_without_gpus_says_so(script: Path) -> None:
    plan = make_plan(RunOptions(target=[str(script)]), env={}, gpus=0)
    assert plan.nproc == 1 and "--nproc N" in plan.notes[0]
    assert make_plan(RunOptions(target=[str(script)]), env={}, gpus=4).nproc == 4


def test_multi_node_and_module_target() -> None:
    plan = make_plan(
        RunOptions(
            target=["-m", "pkg.train"],
            nproc="4",
            nnodes=2,
            node_rank=1,
            rdzv_endpoint="node0:29400",
            rdzv_id="job7",
        ),
        env={},
        gpus=4,
    )
    assert "--nnodes=2" in plan.argv and "--node-rank=1" in plan.argv
    assert "--rdzv-endpoint=node0:29400" in plan.argv and "--rdzv-id=job7" in plan.argv
    assert plan.argv[-3:] == ["-m", "--", "pkg.train"] and "--standalone" not in plan.argv


def test_a_multi_node_job_gets_no_shared_rendezvous_id(script: Path) -> None:
    # The rendezvous id is torchrun's run id, which Run takes for the job id (checkpoint
    # lineage): a constant one would make every job rotate the others' checkpoints.
    options = RunOptions(target=[str(script)], nnodes=2, rdzv_endpoint="node0:29400")
    plain = make_plan(options, env={}, gpus=0)
    assert not [a for a in plain.argv if a.startswith("--rdzv-id")]  # torchrun's "none"
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_NODEID": "0"}
    assert "--rdzv-id=4242" in make_plan(RunOptions(target=[str(script)]), env=slurm, gpus=0).argv


def test_the_scripts_flags_come_after_a_double_dash_for_torchrun(script: Path) -> None:
    plan = make_plan(RunOptions(target=[str(script), "--n", "5"]), env={}, gpus=0)
    assert plan.argv[-4:] == ["--", str(script), "--n", "5"]


def test_slurm_allocation_gives_nodes_and_host(script: Path) -> None:
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "3",
        "SLURM_NODEID": "2",
        "SLURM_JOB_NODELIST": "gpu[11-13]",
    }
    plan = make_plan(RunOptions(target=[str(script)], nproc="8"), env=env, gpus=8)
    assert (plan.nnodes, plan.node_rank, plan.source) == (3, 2, "slurm")
    assert plan.endpoint == f"gpu11:{20000 + 4242 % 10000}"


@pytest.mark.parametrize(
    "options,needle",
    [
        (dict(target=["missing.py"]), "Script missing.py not found"),
        (dict(target=[]), "Nothing to run"),
        (dict(target=["-m"]), "-m needs a module"),
        (dict(target=["-m", "x"], nproc="zero"), "whole number or 'auto'"),
        (dict(target=["-m", "x"], nnodes=2), "needs --rdzv-endpoint"),
        (dict(target=["-m", "x"], nnodes=2, node_rank=2, rdzv_endpoint="h:1"), "--node-rank 2"),
    ],
)
def test_bad_options(options: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make_plan(RunOptions(**options), env={}, gpus=0)  # type: ignore[arg-type]


def test_machine_mismatches(script: Path) -> None:
    with pytest.raises(EnvironmentMismatchError, match="--backend nccl needs CUDA GPUs"):
        make_plan(RunOptions(target=[str(script)], backend="nccl"), env={}, gpus=0)
    with pytest.raises(EnvironmentMismatchError, match="only 2 GPU"):
        make_plan(RunOptions(target=[str(script)], nproc="4"), env={}, gpus=2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(EnvironmentMismatchError, match="already in use") as err:
            make_plan(
                RunOptions(target=[str(script)], nnodes=1, rdzv_endpoint=f"127.0.0.1:{port}"),
                env={},
                gpus=0,
            )
    assert "--rdzv-endpoint 127.0.0.1:" in str(err.value)


def test_failure_summary_names_rank_and_signal() -> None:
    report = """Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_20:31:05
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 16805)
"""
    assert failure_summary(report) == "rank 1 (local rank 1) was killed by SIGKILL"
    assert failure_summary("no report") is None


def test_failure_message_points_only_at_a_known_run_dir(tmp_path: Path) -> None:
    known = failure_message(1, "", tmp_path, 2)
    assert "torchrun exited with code 1, after 0 of 2 allowed restart(s)" in known
    assert f"are in {tmp_path}" in known and "--max-restarts" not in known  # not a signal
    (tmp_path / "restarts.jsonl").write_text('{"restart": 1, "step": 4}\n{"restart": 2}\n')
    assert "after 2 of 3 allowed restart(s)" in failure_message(1, "", tmp_path, 3)
    assert "how many ran is not known" in failure_message(1, "", None, 3)
    unknown = failure_message(1, "", None, 0)
    assert "reported no run dir" in unknown and "runs/" not in unknown
    other_node = failure_message(1, "", None, 0, node_rank=1)
    assert "node 0's paratrain run names the run dir" in other_node
    (tmp_path / "r.json").write_text('{"run_dir": "/abs/run"}')
    assert reported_run_dir(tmp_path / "r.json", known=None) == Path("/abs/run")
    assert reported_run_dir(tmp_path / "missing.json", known=tmp_path) == tmp_path


def test_failure_summary_skips_a_rank_that_only_lost_its_peer() -> None:
    report = (
        "[rank0]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:31384.\n"
        "Failures:\n[1]:\n  time      : t\n  host      : h\n  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : 5 (pid: 12)\n--------\nRoot Cause (first observed failure):\n[0]:\n"
        "  time      : t\n  host      : h\n  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : 1 (pid: 11)\n"
    )
    assert failure_summary(report) == "rank 1 (local rank 1) exited with code 5"


@pytest.mark.parametrize("endpoint", ["host:notaport", "127.0.0.1:99999", ":29500", "node0"])
def test_bad_rendezvous_endpoints_are_named(script: Path, endpoint: str) -> None:
    options = RunOptions(target=[str(script)], nnodes=2, node_rank=1, rdzv_endpoint=endpoint)
    with pytest.raises(ConfigError, match="must be HOST:PORT"):
        make_plan(options, env={}, gpus=0)


def test_a_folder_given_as_the_script_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a folder, not a script"):
        make_plan(RunOptions(target=[str(tmp_path)]), env={}, gpus=0)


def test_too_many_cpu_ranks_are_refused_and_oversubscription_is_noted(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("paratrain.commands.run.plan._cpu_cores", lambda: 2)
    with pytest.raises(EnvironmentMismatchError, match="at most --nproc 8 here"):
        make_plan(RunOptions(target=[str(script)], nproc="9"), env={}, gpus=0)
    plan = make_plan(RunOptions(target=[str(script)], nproc="3"), env={}, gpus=0)
    assert any("3 CPU ranks share 2 core(s)" in n for n in plan.notes)
    assert not make_plan(RunOptions(target=[str(script)], nproc="2"), env={}, gpus=0).notes


@pytest.mark.parametrize(
    "arg,needle",
    [
        ("--bogus", "torchrun rejects it (unrecognized arguments: --bogus)"),
        ("--nproc-per-node=3", "Use paratrain run's own --nproc flag"),
        ("--standalone", "own --rdzv-endpoint flag"),
        ("--max_restarts=2", "own --max-restarts flag"),
        ("", "is not a torchrun option"),
        ([], "is not a torchrun option"),  # what argparse makes of `--torchrun-arg=--`
    ],
)
def test_torchrun_args_are_checked_by_torchrun_s_parser(
    script: Path, arg: Any, needle: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        make_plan(RunOptions(target=[str(script)], nproc="1", torchrun_args=[arg]), env={}, gpus=0)
    ok = make_plan(
        RunOptions(target=[str(script)], nproc="1", torchrun_args=["--log-dir=logs"]),
        env={},
        gpus=0,
    )
    assert "--log-dir=logs" in ok.argv


@pytest.mark.parametrize("run_dir", ["/proc/x", "file", "file/sub", "a" * 300])
def test_an_unusable_run_dir_is_refused_before_launch(
    script: Path, tmp_path: Path, run_dir: str
) -> None:
    (tmp_path / "file").write_text("")
    options = RunOptions(target=[str(script)], nproc="1", run_dir=tmp_path / run_dir)
    with pytest.raises(ConfigError, match="--run-dir"):
        make_plan(options, env={}, gpus=0)


def test_garbled_slurm_variables_are_named() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "two", "SLURM_NODEID": "0"}
    with pytest.raises(ConfigError, match="SLURM_NNODES='two' is not an integer"):
        make_plan(RunOptions(target=["-m", "x"], nproc="1"), env=env, gpus=0)
    env = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_NODEID": "5"}
    with pytest.raises(ConfigError, match="do not fit together"):
        make_plan(RunOptions(target=["-m", "x"], nproc="1"), env=env, gpus=0)


def test_an_elastic_job_goes_to_torchrun_as_min_max(script: Path) -> None:
    options = RunOptions(
        target=[str(script)], nnodes=2, min_nnodes=1, max_restarts=3, rdzv_endpoint="node0:29400"
    )
    plan = make_plan(options, env={}, gpus=0)
    assert "--nnodes=1:2" in plan.argv and not any(a.startswith("--node-rank") for a in plan.argv)
    assert "--rdzv-backend=c10d" in plan.argv and plan.describe().startswith("elastic: 1 to 2")


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"rdzv_endpoint": None}, "needs --rdzv-endpoint"),
        ({"node_rank": 0}, "Leave --node-rank out"),
        ({"max_restarts": 0}, "needs --max-restarts K >= 1"),
    ],
)
def test_elastic_settings_that_cannot_work_are_named(
    script: Path, changes: dict[str, Any], needle: str
) -> None:
    settings: dict[str, Any] = {
        "nnodes": 2, "min_nnodes": 1, "max_restarts": 3, "rdzv_endpoint": "node0:29400"
    }  # fmt: skip
    with pytest.raises(ConfigError, match=needle):
        make_plan(RunOptions(target=[str(script)], **{**settings, **changes}), env={}, gpus=0)


def test_nnodes_reads_n_or_min_max() -> None:
    import argparse

    from paratrain.commands.run.command import node_count

    assert node_count("2") == (2, 2) and node_count("1:4") == (1, 4)
    for bad in ("0", "4:1", "a:b", "1:", ":2"):
        with pytest.raises(argparse.ArgumentTypeError):
            node_count(bad)
