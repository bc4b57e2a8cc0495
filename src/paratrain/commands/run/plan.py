"""Turn ``paratrain run`` options (and a Slurm allocation) into a torchrun command line.

    plan = make_plan(options, env=os.environ, gpus=visible_gpus())
    plan.argv        # [python, -m, torch.distributed.run, --nnodes=2, ..., train.py, --lr, 3]
    plan.describe()  # "2 nodes x 4 ranks = 8 ranks, this node 0, nccl on cuda:0-3, ..."

Only torchrun's own c10d rendezvous is used; nothing here manages processes.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from paratrain.core.paths import check_creatable
from paratrain.distributed.environment import (
    BACKEND_VAR,
    PREVIOUS_RUN_VAR,
    REPORT_VAR,
    RUN_DIR_VAR,
)
from paratrain.distributed.ports import free_port, port_is_free
from paratrain.distributed.topology import env_int, first_host, slurm_rendezvous_port
from paratrain.errors import ConfigError, EnvironmentMismatchError

DEFAULT_PORT = 29500


@dataclass(kw_only=True)
class RunOptions:
    """What the user asked for on the command line."""

    target: list[str]
    """``[script.py, args...]`` or ``[-m, module, args...]``."""
    nproc: str = "auto"
    nnodes: int | None = None
    min_nnodes: int | None = None
    """``--nnodes MIN:MAX``: an elastic job of MIN to ``nnodes`` machines (None: a fixed size)."""
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    """``--rdzv-id``: the job's id (checkpoint lineage, tracker runs). Default: the Slurm job id,
    else none (each job then generates one, see :mod:`paratrain.distributed.job_id`)."""
    max_restarts: int = 0
    run_dir: Path | None = None
    """``--run-dir``; None leaves the choice to the script (its ``run_dir=`` or the default)."""
    backend: str | None = None
    previous_run: str | None = None
    """``--resume`` / ``--fresh``: what every rank does with another run's checkpoints."""
    torchrun_args: list[str] = field(default_factory=list)
    report: Path | None = None
    """A file the script's main process writes its resolved run dir into (``PARATRAIN_REPORT``)."""


@dataclass(kw_only=True)
class LaunchPlan:
    """A resolved launch."""

    argv: list[str]
    env: dict[str, str]
    nnodes: int
    nproc: int
    node_rank: int
    endpoint: str | None
    backend: str
    source: str
    notes: list[str] = field(default_factory=list)
    min_nnodes: int | None = None
    """An elastic job's fewest nodes (None: a fixed size of ``nnodes``)."""

    def describe(self) -> str:
        """One line for the user, printed before starting."""
        where = f"rendezvous {self.endpoint}" if self.endpoint else "standalone (local rendezvous)"
        if self.min_nnodes is not None:
            return (
                f"elastic: {self.min_nnodes} to {self.nnodes} node(s) x {self.nproc} rank(s); "
                f"backend {self.backend}; {where}; a node lost or added is a restart that resumes "
                "from the newest checkpoint at the new world size, keeping the global batch"
            )
        return (
            f"{self.nnodes} node(s) x {self.nproc} rank(s) = {self.nnodes * self.nproc} "
            f"rank(s); this node {self.node_rank}; backend {self.backend}; {where}; "
            f"topology from {self.source}"
        )


# CPU ranks beyond this many per core are refused: each is a whole Python process with torch.
MAX_CPU_RANKS_PER_CORE = 4


def _cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _nproc(value: str, gpus: int, notes: list[str]) -> int:
    if value == "auto":
        if gpus:
            return gpus
        notes.append(
            "no GPU visible: --nproc auto starts 1 CPU rank (use --nproc N for N CPU "
            "ranks over gloo)"
        )
        return 1
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"--nproc {value!r} must be a whole number or 'auto'.") from None
    if n < 1:
        raise ConfigError(f"--nproc must be >= 1, got {n}.")
    return n


def _check_cpu_ranks(nproc: int, backend: str, gpus: int, notes: list[str]) -> None:
    if backend == "nccl" and gpus:
        return  # one GPU each, checked by _backend
    cores = _cpu_cores()
    if nproc > MAX_CPU_RANKS_PER_CORE * cores:
        raise EnvironmentMismatchError(
            f"--nproc {nproc} CPU ranks on {cores} CPU core(s): each rank is a whole process "
            f"with its own copy of torch and the model, so this many would exhaust the machine. "
            f"Use at most --nproc {MAX_CPU_RANKS_PER_CORE * cores} here (--nproc {cores} for "
            "one rank per core), or run on more nodes."
        )
    if nproc > cores:
        notes.append(
            f"{nproc} CPU ranks share {cores} core(s): each runs slower than on its own core"
        )


# Flags paratrain sets itself: passing them through --torchrun-arg would silently override it.
_OWN_FLAGS = {
    "--nproc-per-node": "--nproc", "--nproc_per_node": "--nproc", "--nnodes": "--nnodes",
    "--node-rank": "--node-rank", "--node_rank": "--node-rank", "--max-restarts": "--max-restarts",
    "--max_restarts": "--max-restarts", "--rdzv-endpoint": "--rdzv-endpoint",
    "--rdzv_endpoint": "--rdzv-endpoint", "--rdzv-id": "--rdzv-id", "--rdzv_id": "--rdzv-id",
    "--standalone": "--rdzv-endpoint", "--rdzv-backend": "--rdzv-endpoint",
    "--rdzv_backend": "--rdzv-endpoint",
}  # fmt: skip


def _check_torchrun_args(extra: list[str], torchrun_argv: list[str], target: list[str]) -> None:
    """Refuse a --torchrun-arg torchrun would reject, or one that overrides paratrain's flags."""
    if not extra:
        return
    for arg in extra:
        if not isinstance(arg, str) or not arg:  # argparse turns `--torchrun-arg=--` into []
            raise ConfigError(
                f"--torchrun-arg got {arg if isinstance(arg, str) else '--'!r}, which is not a "
                "torchrun option. Pass one option per flag, with its value after '=', e.g. "
                "--torchrun-arg=--log-dir=logs."
            )
        name = arg.split("=", 1)[0]
        if name in _OWN_FLAGS:
            raise ConfigError(
                f"--torchrun-arg {arg!r} sets what paratrain run already sets; one would be "
                f"ignored. Use paratrain run's own {_OWN_FLAGS[name]} flag instead."
            )
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()

    def refuse(message: str) -> NoReturn:
        raise ConfigError(
            f"--torchrun-arg {' '.join(extra)!r}: torchrun rejects it ({message}). Pass one "
            "torchrun flag per --torchrun-arg, as --torchrun-arg=--flag=value; `python -m "
            "torch.distributed.run --help` lists them."
        )

    parser.error = refuse  # type: ignore[method-assign]
    with contextlib.redirect_stdout(io.StringIO()):  # --help would print
        try:
            parser.parse_args([*torchrun_argv, *extra, *target])
        except SystemExit:
            refuse("it asked for help or exited")


def _target(options: RunOptions) -> list[str]:
    """torchrun's end of the command: ``-- script.py args`` or ``-m -- module args``. The ``--``
    keeps the script's own flags from torchrun, whose parser would take ``--n 5`` for an
    abbreviation of its ``--nnodes``/``--nproc-per-node`` (or refuse it as ambiguous)."""
    target = options.target
    if not target:
        raise ConfigError(
            "Nothing to run. Give a script (`paratrain run train.py`) or a module "
            "(`paratrain run -m pkg.train`)."
        )
    if target[0] == "-m":
        if len(target) < 2:
            raise ConfigError("-m needs a module name: `paratrain run -m pkg.train`.")
        return ["-m", "--", *target[1:]]
    script = Path(target[0])
    if script.is_dir():
        raise ConfigError(
            f"{script} is a folder, not a script. Give the training script's path (e.g. "
            f"{script / 'train.py'}), or `-m package.module` for a module."
        )
    if not script.is_file():
        raise ConfigError(
            f"Script {script} not found (working directory {Path.cwd()}). Check "
            "the path, or use `-m package.module` for a module."
        )
    return ["--", *target]


def make_plan(options: RunOptions, *, env: Mapping[str, str], gpus: int) -> LaunchPlan:
    """Validate ``options`` on this machine and build the torchrun command."""
    notes: list[str] = []
    target = _target(options)
    nproc = _nproc(options.nproc, gpus, notes)
    backend = _backend(options.backend, nproc, gpus)
    _check_cpu_ranks(nproc, backend, gpus, notes)
    if options.run_dir is not None:
        check_creatable(options.run_dir, "--run-dir")
    nnodes, node_rank, endpoint, source = _nodes(options, env)
    if options.min_nnodes is not None:
        _check_elastic(options)
    if endpoint is not None:
        _check_endpoint(endpoint)
    if nnodes > 1 and endpoint is None:
        raise ConfigError(
            f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the host of node 0), the same "
            "on every node."
        )
    if endpoint is not None and node_rank == 0 and options.min_nnodes is None:
        _check_port_free(endpoint)  # elastic: the first agent on that host serves it
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={options.max_restarts}",
        "--monitor-interval=0.5",
    ]
    if endpoint is None:
        argv.append("--standalone")
    else:
        elastic = options.min_nnodes is not None
        argv += [
            f"--nnodes={options.min_nnodes}:{nnodes}" if elastic else f"--nnodes={nnodes}",
            *([] if elastic else [f"--node-rank={node_rank}"]),  # elastic: torchrun assigns
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
        ]
        rdzv_id = options.rdzv_id or env.get("SLURM_JOB_ID")
        if rdzv_id:  # else torchrun's "none", and every Run makes a job id of its own
            argv.append(f"--rdzv-id={rdzv_id}")
    _check_torchrun_args(options.torchrun_args, argv[3:], target)
    return LaunchPlan(
        argv=[*argv, *options.torchrun_args, *target],
        env=_run_env(options, env),
        nnodes=nnodes,
        min_nnodes=options.min_nnodes,
        nproc=nproc,
        node_rank=node_rank,
        endpoint=endpoint,
        backend=backend,
        source=source,
        notes=notes,
    )


def _check_elastic(options: RunOptions) -> None:
    low, high = options.min_nnodes, options.nnodes
    assert low is not None and high is not None
    if not 1 <= low <= high:
        raise ConfigError(
            f"--nnodes {low}:{high} is not MIN:MAX with 1 <= MIN <= MAX. Pass e.g. --nnodes 1:4."
        )
    if options.rdzv_endpoint is None:
        raise ConfigError(
            f"--nnodes {low}:{high} needs --rdzv-endpoint HOST:PORT, the same on every node: the "
            "machine that hosts the rendezvous (it must stay up; losing it ends the job)."
        )
    if options.node_rank is not None:
        raise ConfigError(
            f"--nnodes {low}:{high} is elastic: torchrun numbers the nodes at each rendezvous. "
            "Leave --node-rank out."
        )
    if options.max_restarts < 1:
        raise ConfigError(
            f"--nnodes {low}:{high} needs --max-restarts K >= 1: each node lost or added is a "
            "restart of the job (which resumes from the newest checkpoint). Pass e.g. "
            "--max-restarts 10."
        )


def _backend(asked: str | None, nproc: int, gpus: int) -> str:
    backend = asked or ("nccl" if gpus else "gloo")
    if backend == "nccl" and not gpus:
        raise EnvironmentMismatchError(
            "--backend nccl needs CUDA GPUs, but torch sees none. Use --backend gloo (CPU ranks) "
            "or run on a GPU machine; `paratrain doctor` explains what torch sees."
        )
    if gpus and backend == "nccl" and nproc > gpus:
        raise EnvironmentMismatchError(
            f"--nproc {nproc} but only {gpus} GPU(s) are visible; each rank needs its own GPU. "
            f"Use --nproc {gpus} (or auto), or --backend gloo for CPU ranks."
        )
    return backend


def _check_endpoint(endpoint: str) -> None:
    host, colon, port = endpoint.rpartition(":")
    digits = port.isascii() and port.isdigit()
    if not colon or not host or not digits or not 1 <= int(port) <= 65535:
        raise ConfigError(
            f"--rdzv-endpoint {endpoint!r} must be HOST:PORT with a port from 1 to 65535, e.g. "
            f"node0:29500 (the same on every node)."
        )


def _check_port_free(endpoint: str) -> None:
    host, _, port = endpoint.rpartition(":")
    if host in ("127.0.0.1", "localhost", socket.gethostname()) and not port_is_free(
        host, int(port)
    ):
        raise EnvironmentMismatchError(
            f"Port {port} on {host} is already in use, so node 0 cannot host the "
            f"rendezvous. Pick a free one, e.g. --rdzv-endpoint {host}:{free_port()}."
        )


def _run_env(options: RunOptions, env: Mapping[str, str]) -> dict[str, str]:
    """What the ranks get on top of this process's environment (see
    paratrain.distributed.environment)."""
    run_env = {"OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}
    if options.run_dir is not None:
        run_env[RUN_DIR_VAR] = str(options.run_dir)
    if options.backend:
        run_env[BACKEND_VAR] = options.backend
    if options.report is not None:
        run_env[REPORT_VAR] = str(options.report)
    if options.previous_run is not None:
        run_env[PREVIOUS_RUN_VAR] = options.previous_run
    return run_env


def _nodes(options: RunOptions, env: Mapping[str, str]) -> tuple[int, int, str | None, str]:
    if "SLURM_JOB_ID" in env and options.nnodes is None:
        nnodes = env_int(env, "SLURM_NNODES", 1)
        node_rank = env_int(env, "SLURM_NODEID", 0)
        if nnodes < 1 or not 0 <= node_rank < nnodes:
            raise ConfigError(
                f"Slurm says SLURM_NNODES={nnodes} and SLURM_NODEID={node_rank}, which do not fit "
                "together. Run inside a real allocation (srun), or pass --nnodes and --node-rank."
            )
        host = first_host(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1")
        port = slurm_rendezvous_port(env)
        endpoint = options.rdzv_endpoint or (f"{host}:{port}" if nnodes > 1 else None)
        return nnodes, node_rank, endpoint, "slurm"
    nnodes = options.nnodes or 1
    node_rank = options.node_rank or 0
    if not 0 <= node_rank < nnodes:
        raise ConfigError(
            f"--node-rank {node_rank} must be in 0..{nnodes - 1} for --nnodes {nnodes}."
        )
    return nnodes, node_rank, options.rdzv_endpoint, "command line"
