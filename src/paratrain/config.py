"""Settings of a :class:`paratrain.Run`, as data, validated in one place.

    cfg = RunConfig(strategy="ddp", precision="bf16", grad_accum=4, max_grad_norm=1.0)
    run = paratrain.Run(cfg)          # or paratrain.Run(strategy="ddp", ...)

Every default runs on a CPU-only machine. Device-dependent checks (a GPU for ``cuda``, ranks per
machine vs GPUs) happen when the strategy is chosen, in :mod:`paratrain.strategies`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from paratrain.errors import ConfigError
from paratrain.module_policy import ModulePolicy

STRATEGY_NAMES = ("cpu", "single", "dp", "ddp", "fsdp")
"""Every strategy name; :mod:`paratrain.strategies` maps each to its class."""
PRECISIONS = ("fp32", "bf16", "fp16")
ACCELERATORS = ("auto", "cpu", "cuda")
BACKENDS = ("nccl", "gloo")
COMM_HOOKS = ("fp16", "bf16")


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """Everything :class:`paratrain.Run` needs to know before the model exists."""

    strategy: str = "auto"
    """How the model is placed and synchronised: auto, cpu, single, dp, ddp or fsdp."""
    accelerator: str = "auto"
    """Device kind: ``auto`` (cuda when a GPU is visible, else cpu), ``cpu`` or ``cuda``."""
    backend: str | None = None
    """Collective backend; default ``paratrain run --backend``, else nccl on cuda, gloo on cpu."""
    precision: str = "fp32"
    """``fp32``, ``bf16`` (autocast) or ``fp16`` (autocast + dynamic loss scaling)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; gradients are synchronised on the last one only."""
    global_batch: int | None = None
    """Samples per optimizer step over all ranks. When set, grad_accum is derived from it at
    the first ``run.loader`` (global batch / (per-rank batch x world size)); it must divide."""
    per_rank_batch: int | None = None
    """Samples per rank per micro-batch, for loops that draw their own batches (no
    ``run.loader``): with ``global_batch`` it sets grad_accum when the Run starts."""
    max_grad_norm: float | None = None
    """Clip the global gradient norm to this value before each step (after unscaling)."""
    seed: int = 0
    """Shared by all ranks: model initialisation and the samplers' shuffling. After the first
    ``run.setup`` every rank's python/numpy/torch generators follow ``run.rank_seed`` (rank 0
    keeps ``seed``), so dropout, augmentation and own batch sampling differ across ranks."""
    run_dir: str | Path | None = None
    """Where logs, stats, checkpoints go (default ``paratrain run --run-dir``, else
    runs/paratrain). Passing a different one than the launcher is an error."""
    ckpt_dir: str | Path | None = None
    """Where :meth:`Run.save` writes and :meth:`Run.resume` looks (default run_dir/checkpoints)."""
    keep_last: int | None = 3
    """Keep this many newest checkpoints (the newest valid one is never deleted); None keeps all."""
    async_save: bool = False
    """Write checkpoints in the background; training stalls only for the copy to host memory."""
    stats_every: int | None = 10
    """Write per-rank stats (run_dir/stats/rank<r>.jsonl) every this many steps; None: never."""
    tensorboard: bool = False
    """Write :meth:`Run.log` scalars as TensorBoard events under ``run_dir/tensorboard``."""
    progress: bool = True
    """Show a progress bar (main process only) in :meth:`Run.progress`."""
    timeout_s: float = 600.0
    """Timeout of every collective, in seconds; a stalled rank fails the job instead of hanging."""
    watchdog: bool = True
    """Multi-rank runs: a rank idle for 0.9 x timeout_s dumps its stacks to run_dir/stacks and
    exits, so a stall ends the job with a diagnosis instead of hanging."""
    device_ids: list[int] | None = None
    """``dp`` only: the GPUs DataParallel splits each batch over (default all visible)."""
    sync_batchnorm: bool = False
    """``ddp``/``fsdp`` on cuda: convert BatchNorm layers to SyncBatchNorm."""
    find_unused_parameters: bool = False
    """``ddp``: allow parameters that get no gradient in some steps (costs a graph traversal)."""
    broadcast_buffers: bool = True
    """``ddp``: copy rank 0's buffers (e.g. BatchNorm statistics) to all ranks every forward."""
    static_graph: bool = False
    """``ddp``: the set of used parameters never changes; enables extra optimisations."""
    comm_hook: str | None = None
    """``ddp``: compress gradients to ``fp16`` or ``bf16`` for the all-reduce."""
    fsdp_wrap: ModulePolicy = ()
    """``fsdp``: module types (or a predicate) sharded as their own unit; the root always is."""
    activation_checkpointing: ModulePolicy = ()
    """Module types (or a predicate) whose activations are recomputed in backward."""
    num_workers: int | None = None
    """DataLoader workers per rank; default 0 on cpu, min(4, cores per rank) on cuda."""
    extra: dict[str, object] = field(default_factory=dict)
    """Free-form values recorded with the run (hyperparameters, notes)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid setting and its fix."""
        _one_of("strategy", self.strategy, ("auto", *STRATEGY_NAMES))
        _one_of("accelerator", self.accelerator, ACCELERATORS)
        _one_of("precision", self.precision, PRECISIONS)
        if self.backend is not None:
            _one_of("backend", self.backend, BACKENDS)
        if self.comm_hook is not None:
            _one_of("comm_hook", self.comm_hook, COMM_HOOKS)
        _positive_int("grad_accum", self.grad_accum, "grad_accum=1 steps after every micro-batch")
        if self.per_rank_batch is not None:
            _positive_int("per_rank_batch", self.per_rank_batch, "or None to take run.loader's")
        if self.global_batch is not None:
            _positive_int("global_batch", self.global_batch, "or None to use grad_accum")
            if self.grad_accum != 1:
                raise ConfigError(
                    f"global_batch={self.global_batch} and grad_accum={self.grad_accum} both "
                    "set: grad_accum is derived from global_batch. Pass one of them."
                )
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ConfigError(
                f"max_grad_norm must be > 0, got {self.max_grad_norm}. "
                "Pass e.g. max_grad_norm=1.0, or None to not clip."
            )
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0 seconds, got {self.timeout_s}.")
        if self.stats_every is not None:
            _positive_int("stats_every", self.stats_every, "or None to write no stats")
        if self.keep_last is not None:
            _positive_int("keep_last", self.keep_last, "or None to keep every checkpoint")
        if self.num_workers is not None and self.num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0, got {self.num_workers}.")


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(
            f"Unknown {name} {value!r}. Available: {', '.join(allowed)}. "
            f"Pass one of them, e.g. {name}={allowed[0]!r}."
        )


def _positive_int(name: str, value: object, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r} ({hint}).")
