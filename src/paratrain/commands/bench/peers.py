"""The training loops of HuggingFace Accelerate and Lightning Fabric, as benchmark peers.

    check_installed(["accelerate", "fabric"])          # in the parent, before any rank starts
    with contextlib.ExitStack() as stack:              # inside every rank
        loops, skipped = start_peers(["fabric"], spec, config, settings, stack)

Each peer trains the same model (``torch.manual_seed(0)`` before it is built) on the same
batches with the same optimizer (SGD, lr 1e-3, momentum 0.9), strategy and precision as
paratrain's loop and the hand-written reference, written the way each library's documentation
shows. Both libraries adopt the process group that paratrain's spawner made; neither destroys
it. A peer that cannot run a configuration is skipped with the reason instead of failing the
benchmark.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import itertools
import logging
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from paratrain.commands.bench.loops import (
    LAYOUTS,
    Config,
    Loop,
    Settings,
    bench_dataset,
    bench_device,
)
from paratrain.commands.bench.models import ModelSpec
from paratrain.distributed.collectives import reduce
from paratrain.errors import ConfigError

PEERS = ("accelerate", "fabric")
_MODULES = {"accelerate": ("accelerate",), "fabric": ("lightning", "lightning_fabric")}
_DISTRIBUTED = ("ddp", "fsdp")
_ACCELERATE_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
_FABRIC_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
_FABRIC_STRATEGY = {"cpu": "auto", "single": "auto", "dp": "dp", "ddp": "ddp", "fsdp": "fsdp"}


class PeerSkipped(Exception):
    """A peer cannot run this configuration; the message says why."""


def check_installed(names: list[str]) -> None:
    """Raise a ConfigError naming the fix when a requested peer's package is missing.

    check_installed(["accelerate"])     # nothing happens when accelerate is importable
    """
    missing = [n for n in names if not any(_findable(m) for m in _MODULES[n])]
    if missing:
        packages = {"accelerate": "accelerate", "fabric": "lightning-fabric"}
        raise ConfigError(
            f"--compare {','.join(missing)} needs {', '.join(packages[n] for n in missing)}, "
            "which is not installed in this environment. Install the benchmark peers with "
            "`pip install 'paratrain[bench]'`, or leave them out of --compare."
        )


def _findable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def start_peers(
    names: tuple[str, ...] | list[str],
    spec: ModelSpec,
    config: Config,
    settings: Settings,
    stack: contextlib.ExitStack,
) -> tuple[dict[str, Loop], dict[str, str]]:
    """Build and warm up each peer's loop; return the ready loops and the skipped peers' reasons.

    Every rank takes the same decision: a peer that failed to start on any rank is closed and
    skipped on all of them. ``stack`` closes the loops and restores the environment.
    """
    stack.enter_context(_rank_env(config))
    loops: dict[str, Loop] = {}
    skipped: dict[str, str] = {}
    for name in names:
        with _quiet():
            loop, reason = _try_start(name, spec, config, settings)
        if _all_ranks_ok(loop is not None) and loop is not None:
            stack.callback(loop.close)
            loops[name] = loop
            continue
        if loop is not None:
            loop.close()
        skipped[name] = reason or "it failed to start on another rank"
    return loops, skipped


def _try_start(
    name: str, spec: ModelSpec, config: Config, settings: Settings
) -> tuple[Loop | None, str | None]:
    build = accelerate_loop if name == "accelerate" else fabric_loop
    try:
        loop = build(spec, config, settings)
    except PeerSkipped as why:
        return None, str(why)
    except Exception as err:  # the library refused this configuration: say so in the table
        return None, _first_line(err)
    try:
        for _ in range(max(1, settings.warmup)):
            loop.step(*next(loop.batches))
    except Exception as err:
        loop.close()
        return None, _first_line(err)
    return loop, None


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def _all_ranks_ok(ok: bool) -> bool:
    return bool(reduce(1 if ok else 0, "min"))


@contextlib.contextmanager
def _rank_env(config: Config) -> Iterator[None]:
    """The launcher variables both libraries read, set while the peers live, then restored.

    paratrain's spawner joins every rank to a process group through a file, so RANK,
    WORLD_SIZE, LOCAL_RANK may be absent. Accelerate decides from LOCAL_RANK / WORLD_SIZE that
    it runs distributed (and reads RANK on CPU), and Fabric's LightningEnvironment takes the
    rank from LOCAL_RANK and treats the processes as started by someone else only when it is
    set; without them they would train single-process or spawn processes of their own. The
    group already exists, so neither initialises one and MASTER_ADDR/PORT are never dialled.
    Single-process strategies get no variables: both libraries then run undistributed. The
    whole environment is restored afterwards, so that the next configuration in this rank
    (and paratrain's own loop, which reads these variables too) starts from the same one.
    """
    before = dict(os.environ)  # Accelerate also sets ACCELERATE_USE_FSDP and others for good
    if config.strategy in _DISTRIBUTED and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        wanted = {
            "RANK": rank,
            "WORLD_SIZE": world,
            "LOCAL_RANK": rank,
            "LOCAL_WORLD_SIZE": world,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": 29500,
        }
        for key, value in wanted.items():
            os.environ.setdefault(key, str(value))
    try:
        yield
    finally:
        for key in set(os.environ) - set(before):
            del os.environ[key]
        os.environ.update(before)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Info logs and warnings off while a peer starts (errors still show and raise).

    Process-wide, because both libraries set their loggers' levels when first imported, which
    happens inside this block.
    """
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _peer_loop(
    backward: Any,
    model: Any,
    optimizer: Any,
    spec: ModelSpec,
    settings: Settings,
    device: torch.device,
    loader: Any,
    *,
    close: Any,
) -> Loop:
    """A peer's training step (zero, the peer's own ``backward``, step) as a :class:`Loop`."""

    def step(x: Any, y: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        backward(spec.loss(model(x), y))
        optimizer.step()

    return Loop(
        step=step,
        batches=_batches(spec, settings, device, loader),
        device=device,
        close=close,
        parameters=lambda: list(model.parameters()),
    )


def _loader(spec: ModelSpec, settings: Settings) -> DataLoader[Any] | None:
    """The plain loader each library shards itself (None for the one fixed synthetic batch)."""
    if settings.data != "loader":
        return None
    return DataLoader(bench_dataset(spec, settings), batch_size=settings.batch_size, shuffle=True)


def _batches(
    spec: ModelSpec, settings: Settings, device: torch.device, loader: Any
) -> Iterator[tuple[Any, torch.Tensor]]:
    """The fixed batch, or the prepared loader's passes (already on ``device``)."""
    if loader is None:
        return itertools.repeat(spec.batch(settings.batch_size, device))
    return itertools.chain.from_iterable(itertools.repeat(loader))


def _model_and_optimizer(spec: ModelSpec) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = spec.build()
    return model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def accelerate_loop(spec: ModelSpec, config: Config, settings: Settings) -> Loop:
    """HuggingFace Accelerate's loop for ``config``, ready to step.

    loop = accelerate_loop(spec, Config("ddp", "fp32", 2), settings)
    loop.step(*next(loop.batches))
    """
    if config.strategy == "dp":
        raise PeerSkipped("Accelerate has no nn.DataParallel mode (one process per device: ddp)")
    if config.strategy == "tp":
        raise PeerSkipped("not compared: Accelerate's tensor parallelism needs its own model plan")
    if config.strategy == "pipeline":
        raise PeerSkipped("not compared: Accelerate pipelines inference only")
    if config.strategy in LAYOUTS:
        raise PeerSkipped("not compared: 2-D meshes take each peer's own parallelism config")
    from accelerate import Accelerator

    _reset_accelerate()
    device = bench_device()
    kwargs: dict[str, Any] = {}
    if config.strategy == "fsdp":
        kwargs["fsdp_plugin"] = _fsdp_plugin()
    with contextlib.redirect_stdout(io.StringIO()):
        accelerator = Accelerator(
            cpu=device.type == "cpu",
            mixed_precision=_ACCELERATE_PRECISION[config.precision],
            **kwargs,
        )
    wanted = "FSDP" if config.strategy == "fsdp" else None
    got = accelerator.distributed_type.name
    if wanted and got != wanted:
        _reset_accelerate()
        raise PeerSkipped(
            f"Accelerate runs FSDP only on GPUs: on {device.type} it ignores the FSDP plugin "
            f"and trains {got}"
        )
    model, optimizer = _model_and_optimizer(spec)
    loader = _loader(spec, settings)
    if loader is None:
        model, optimizer = accelerator.prepare(model, optimizer)
    else:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return _peer_loop(
        accelerator.backward,
        model,
        optimizer,
        spec,
        settings,
        accelerator.device,
        loader,
        close=_reset_accelerate,
    )


def _fsdp_plugin() -> Any:
    """Accelerate's FSDP plugin: FSDP2 (``fully_shard``) where this version has it."""
    import inspect

    from accelerate import FullyShardedDataParallelPlugin

    if "fsdp_version" in inspect.signature(FullyShardedDataParallelPlugin).parameters:
        return FullyShardedDataParallelPlugin(fsdp_version=2)
    return FullyShardedDataParallelPlugin()


def _reset_accelerate() -> None:
    """Forget Accelerate's process-wide state (it never destroys the process group).

    Accelerate keeps one state per process and refuses a second Accelerator with other
    settings; the next configuration measured in this rank needs a fresh one.
    """
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def fabric_loop(spec: ModelSpec, config: Config, settings: Settings) -> Loop:
    """Lightning Fabric's loop for ``config``, ready to step.

    loop = fabric_loop(spec, Config("ddp", "bf16", 2), settings)
    loop.step(*next(loop.batches))
    """
    device = bench_device()
    if config.strategy == "tp":
        raise PeerSkipped("not compared: Fabric's ModelParallelStrategy takes its own function")
    if config.strategy == "pipeline":
        raise PeerSkipped("not compared: Lightning Fabric has no pipeline parallelism")
    if config.strategy in LAYOUTS:
        raise PeerSkipped("not compared: 2-D meshes take each peer's own parallelism config")
    if config.strategy == "fsdp" and device.type != "cuda":
        raise PeerSkipped(f"Lightning Fabric runs FSDP only on GPUs, not on {device.type}")
    if config.precision == "fp16" and device.type == "cpu":
        raise PeerSkipped("Lightning Fabric has no fp16 mixed precision on CPU (it uses bf16)")
    fabric_class, environment = _fabric_imports()
    world = dist.get_world_size() if dist.is_initialized() else 1
    devices = {"dp": torch.cuda.device_count(), "ddp": world, "fsdp": world}.get(config.strategy, 1)
    with contextlib.redirect_stdout(io.StringIO()):
        fabric = fabric_class(
            accelerator="cuda" if device.type == "cuda" else "cpu",
            devices=devices,
            strategy=_FABRIC_STRATEGY[config.strategy],
            precision=_FABRIC_PRECISION[config.precision],
            # Not SLURM's or torchelastic's: the ranks are paratrain's, described by _rank_env.
            plugins=[environment()],
        )
        fabric.launch()  # the processes exist and the group is joined: this only sets up
    model, optimizer = _model_and_optimizer(spec)
    model, optimizer = fabric.setup(model, optimizer)
    loader = _loader(spec, settings)
    if loader is not None:
        loader = fabric.setup_dataloaders(loader)
    # Fabric tears nothing down that paratrain's spawner owns
    return _peer_loop(
        fabric.backward, model, optimizer, spec, settings, fabric.device, loader, close=lambda: None
    )


def _fabric_imports() -> tuple[Any, Any]:
    """``Fabric`` and ``LightningEnvironment`` from ``lightning.fabric`` (the ``lightning``
    package) or from the standalone ``lightning_fabric``."""
    for root in ("lightning.fabric", "lightning_fabric"):
        try:
            fabric = importlib.import_module(root)
            environments = importlib.import_module(f"{root}.plugins.environments")
        except ImportError:
            continue
        return fabric.Fabric, environments.LightningEnvironment
    check_installed(["fabric"])  # names the fix
    raise ConfigError("Lightning Fabric cannot be imported. `pip install 'paratrain[bench]'`.")
