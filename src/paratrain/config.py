"""Settings of a :class:`paratrain.Run`, as data, validated in one place.

    cfg = RunConfig(strategy="ddp", precision="bf16", grad_accum=4, max_grad_norm=1.0)
    run = paratrain.Run(cfg)          # or paratrain.Run(strategy="ddp", ...)

Every default runs on a CPU-only machine. Device-dependent checks (a GPU for ``cuda``, ranks per
machine vs GPUs) happen when the strategy is chosen, in :mod:`paratrain.strategies`.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import itertools
import re
import textwrap
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from os import PathLike
from pathlib import Path

from torch.nn import Module

from paratrain.checkpoint.backends import check_location
from paratrain.checkpoint.object_storage import is_url, looks_mangled
from paratrain.core.paths import check_creatable
from paratrain.errors import ConfigError
from paratrain.plans.mesh import check_mesh_setting
from paratrain.plans.module_policy import ModulePolicy
from paratrain.plans.pipeline_stages import SplitSetting, check_split_setting
from paratrain.plans.tp import PlanSetting, check_tp_plan
from paratrain.profiling.step_profiler import ProfileSetting, check_profile_setting
from paratrain.trackers.settings import (
    check_combination,
    check_log_to,
    check_project,
    check_run_name,
    check_uri,
)

STRATEGY_NAMES = ("cpu", "single", "dp", "ddp", "fsdp", "tp", "pipeline")
"""Every strategy name; :mod:`paratrain.strategies` maps each to its class."""
PRECISIONS = ("fp32", "bf16", "fp16")
ACCELERATORS = ("auto", "cpu", "cuda")
BACKENDS = ("nccl", "gloo")
PREVIOUS_RUN = ("refuse", "resume", "fresh", "share")
"""What a run that did not resume does with another run's checkpoints (``previous_run``)."""
COMM_HOOKS = ("fp16", "bf16", "powersgd")
PIPELINE_SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b")


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """Everything :class:`paratrain.Run` needs to know before the model exists."""

    strategy: str = "auto"
    """How the model is placed and synchronised: auto, cpu, single, dp, ddp, fsdp, tp or
    pipeline."""
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
    """Where :meth:`Run.save` writes and :meth:`Run.resume` looks (default run_dir/checkpoints):
    a folder, or a URL such as ``s3://bucket/run1`` (any fsspec file system; needs
    ``pip install 'paratrain[s3]'``)."""
    ckpt_storage_options: dict[str, object] | None = field(default=None, repr=False)
    """A URL ``ckpt_dir``: keyword options for ``fsspec.url_to_fs`` (s3fs: ``endpoint_url``,
    ``key``, ``secret``, ``client_kwargs``, ...); None takes them from the environment
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...). Secret-looking values stay out of
    run.json."""
    keep_last: int | None = 3
    """Keep this many newest checkpoints (the newest valid one is never deleted); None keeps all."""
    async_save: bool = False
    """Write checkpoints in the background; training stalls only for the copy to host memory."""
    previous_run: str = "refuse"
    """What a run that did not resume does with another run's checkpoints in its ``ckpt_dir``:
    ``'refuse'`` (stop before the first step, naming both runs), ``'resume'`` (continue from
    them, as after a restart), ``'fresh'`` (move them aside to ``<ckpt_dir>.<their run id>``
    and start at step 0) or ``'share'`` (write beside them on purpose: rotation deletes only
    this run's own, and a resume takes the newest save of any run). ``paratrain run --resume``
    / ``--fresh`` set it for every rank."""
    preempt_signals: tuple[str, ...] | None = ("SIGTERM", "SIGUSR1", "SIGUSR2")
    """Signals that mean "save and stop": at the next safe point every rank saves a checkpoint
    and the process exits with 75 (preempted, resumable); a second signal stops at once. Names
    of ``signal.Signals``; None or ``()`` leaves every signal alone."""
    preempt_grace_s: float = 25.0
    """Seconds from the preemption signal within which the save must be done; past them it is
    abandoned (the previous checkpoint stays the newest) and the process exits all the same."""
    stats_every: int | None = 10
    """Write per-rank stats (run_dir/stats/rank<r>.jsonl) every this many steps (written out at
    most twice a second); None: never."""
    tensorboard: bool = False
    """Write :meth:`Run.log` scalars as TensorBoard events under ``run_dir/tensorboard`` (the
    same as ``'tensorboard'`` in ``log_to``)."""
    log_to: str | list[str] | tuple[str, ...] | None = ()
    """Experiment trackers that get :meth:`Run.log` scalars and, once per tracker run, every
    setting with ``extra`` as hyper-parameters, from the main process: ``'tensorboard'``,
    ``'mlflow'``, ``'wandb'`` or a list of them (metrics.jsonl is written either way). A resumed
    run continues the same tracker runs."""
    tracker_project: str = "paratrain"
    """``log_to``: the MLflow experiment and wandb project the tracker runs go to."""
    tracker_run_name: str | None = None
    """``log_to``: the MLflow run name and wandb display name; default the run dir's name."""
    mlflow_tracking_uri: str | None = None
    """``log_to`` with mlflow: where MLflow keeps runs; default the MLFLOW_TRACKING_URI variable,
    else a file store in run_dir/mlruns."""
    progress: bool = True
    """Show a progress bar (main process only) in :meth:`Run.progress`."""
    profile: ProfileSetting = None
    """Profile a window of steps on every rank with ``torch.profiler``: ``True`` (records steps
    7-9), a ``pt.Profile(wait=, warmup=, active=)`` or a dict of those. Writes a trace per rank
    under ``run_dir/profile`` and prints where each rank's step time went."""
    timeout_s: float = 600.0
    """Timeout of every collective, in seconds; a stalled rank fails the job instead of hanging."""
    watchdog: bool = True
    """Multi-rank runs: a rank idle for 0.9 x timeout_s dumps its stacks to run_dir/stacks and
    exits, so a stall ends the job with a diagnosis instead of hanging."""
    stall_s: float | None = None
    """Multi-rank runs with the watchdog: seconds without progress, while a rank waits in a
    collective, after which every rank's collectives are compared and the hang is named (which
    rank, which collective, which line), and the job ends with exit 124. None: max(30 s, 20 x the
    p99 step time). ``timeout_s`` stays the hard limit."""
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
    """``ddp``: compress gradients for the all-reduce: ``fp16``, ``bf16``, or ``powersgd``
    (low-rank approximation with error feedback)."""
    powersgd_rank: int = 1
    """``ddp`` with ``comm_hook='powersgd'``: rank of the gradient approximation (higher is
    closer to exact and sends more)."""
    powersgd_warmup: int = 10
    """``ddp`` with ``comm_hook='powersgd'``: optimizer steps of exact all-reduce before
    compression starts."""
    fsdp_wrap: ModulePolicy = ()
    """``fsdp``: module types (or a predicate) sharded as their own unit; the root always is."""
    fsdp_reshard_after_forward: bool = True
    """``fsdp``: free each unit's gathered parameters after forward (gather again in
    backward); False keeps them, trading memory for one all-gather per unit and step. The root
    unit keeps them either way (backward starts with it)."""
    fsdp_offload: bool = False
    """``fsdp`` on GPUs: keep sharded parameters, gradients and optimizer state in host memory
    (``CPUOffloadPolicy``); the optimizer steps on the CPU."""
    mesh: dict[str, int] | None = None
    """``fsdp``/``tp``/``pipeline``: device mesh axes and sizes, outermost first: ``pp``
    (pipeline stages), ``dp_replicate`` (replicate; with ``dp``: HSDP), ``dp`` (FSDP shards),
    ``tp`` (tensor parallel); one size may be -1 (what the world size leaves), e.g.
    ``{'dp': -1, 'tp': 2}``. None: every rank on ``dp`` (``fsdp``), ``tp`` (``tp``) or ``pp``
    (``pipeline``)."""
    tp_plan: PlanSetting | None = None
    """``tp`` (and ``pipeline`` with a tp axis): which layers to split: ``'auto'`` (the MLPs it
    can prove safe), a dict of module name pattern to ``'colwise'``/``'rowwise'``/``'sequence'``/
    ``'output'`` (loss parallel) or a DTensor ParallelStyle, or plans from ``paratrain.tp``
    (``mlp``, ``attention``, ``output``) joined with ``|``."""
    pipeline_split: SplitSetting | None = None
    """``pipeline``: where stages begin, as layer names of an ``nn.Sequential`` model (e.g.
    ``('layers.4',)``), or a function ``(model, stage, stages) -> module`` for any model; None
    cuts an ``nn.Sequential`` into stages of about equal parameter count."""
    pipeline_schedule: str = "1f1b"
    """``pipeline``: ``1f1b`` (one forward, one backward: activations of at most pp
    micro-batches held), ``gpipe`` (all forwards, then all backwards), ``interleaved_1f1b``
    (several stages per rank: a smaller bubble)."""
    pipeline_stages: int | None = None
    """``pipeline``: stages in all (a multiple of pp); default pp, twice pp for
    ``interleaved_1f1b``, or what ``pipeline_split`` names."""
    n_microbatches: int | None = None
    """``pipeline``: micro-batches each per-rank batch is split into (it must divide the batch);
    default one per stage. More shrink the idle bubble, fewer make larger matrix products."""
    activation_checkpointing: ModulePolicy = ()
    """Module types (or a predicate) whose activations are recomputed in backward."""
    num_workers: int | None = None
    """DataLoader workers per rank; default 0 on cpu and for in-memory datasets
    (``TensorDataset``), else min(4, cores per rank - 1); on a GPU the choice is printed."""
    extra: dict[str, object] = field(default_factory=dict)
    """Free-form values recorded with the run (hyperparameters, notes): the main process writes
    them, with every other setting, to ``run_dir/run.json`` and the ``log_to`` trackers."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid setting and its fix."""
        for f in fields(self):
            _CHECKS[f.name](f.name, getattr(self, f.name))
        if self.global_batch is not None and self.grad_accum != 1:
            raise ConfigError(
                f"global_batch={self.global_batch} and grad_accum={self.grad_accum} both "
                "set: grad_accum is derived from global_batch. Pass one of them."
            )
        if self.ckpt_storage_options and not is_url(self.ckpt_dir):
            raise ConfigError(
                f"ckpt_storage_options is set, but ckpt_dir={self.ckpt_dir!r} is not a URL: the "
                "options are for object storage. Pass ckpt_dir='s3://bucket/run1' (as a str), "
                "or leave ckpt_storage_options out."
            )
        check_combination(self)


def make_config(config: object, settings: dict[str, object]) -> RunConfig:
    """The RunConfig of ``Run(config)`` or ``Run(**settings)``; unknown names get the closest."""
    if config is not None and not isinstance(config, RunConfig):
        raise ConfigError(
            f"Run takes a RunConfig or keyword settings, got {config!r}. Name the setting, e.g. "
            f"pt.Run(strategy={config!r})."
        )
    if config is not None and settings:
        raise ConfigError("Pass either a RunConfig or keyword settings to Run, not both.")
    known = [f.name for f in fields(RunConfig)]
    for name in settings:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"Unknown setting {name!r}.{hint} Settings: {', '.join(known)}.")
    made = config if config is not None else RunConfig(**settings)  # type: ignore[arg-type]
    made.validate()  # also a config changed after it was made
    return made


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(
            f"Unknown {name} {value!r}. Available: {', '.join(allowed)}. "
            f"Pass one of them, e.g. {name}={allowed[0]!r}."
        )


def _check_signals(name: str, value: object) -> None:
    import signal

    if value is None:
        return
    names = value if isinstance(value, (tuple, list)) else None
    bad = [
        v for v in names or [value] if not isinstance(v, str) or v not in signal.Signals.__members__
    ]
    if names is None or bad or any(v in ("SIGKILL", "SIGSTOP", "SIGINT") for v in names):
        raise ConfigError(
            f"{name} must be None or a tuple of signal names other than SIGKILL, SIGSTOP and "
            f"SIGINT (which stays Ctrl-C), got {value!r}. Pass e.g. {name}=('SIGTERM', 'SIGUSR1')."
        )


def _check_grace(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}. Pass e.g. 25.")


@dataclass(frozen=True)
class Rule:
    """The check of one setting and the words that describe what it allows."""

    check: Callable[[str, object], None]
    allowed: str


def _choice(allowed: tuple[str, ...], *, optional: bool = False) -> Rule:
    def check(name: str, value: object) -> None:
        if not (optional and value is None):
            _one_of(name, value, allowed)

    words = ", ".join(f"`{a}`" for a in allowed)
    return Rule(check, f"{words}{', None' if optional else ''}")


def _whole(*, low: int, high: int | None = None, optional: bool = False, hint: str = "") -> Rule:
    kind = "a positive integer" if low == 1 else f"an integer >= {low}"
    limit = f" up to {high}" if high is not None else ""
    top = 2**63 - 1 if high is None else high

    def check(name: str, value: object) -> None:
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= top:
            raise ConfigError(
                f"{name} must be {'None or ' if optional else ''}{kind}{limit}, got {value!r}"
                f"{f' ({hint})' if hint else ''}."
            )

    text = f"int ≥ {low}" + (f", ≤ {high}" if high is not None else "")
    return Rule(check, f"{text}{', None' if optional else ''}")


def _number(*, high: float, optional: bool = False, hint: str = "", low: float = 0.0) -> Rule:
    """A number in ``(0, high]``, or ``[low, high]`` when ``low`` is given."""

    def check(name: str, value: object) -> None:
        if optional and value is None:
            return
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        inside = ok and (low <= value if low else value > 0) and value <= high  # type: ignore[operator]
        if not inside:
            allowed = "None or " if optional else ""
            above = f"at least {low:g}" if low else "above 0"
            raise ConfigError(
                f"{name} must be {allowed}a number {above} and at most {high:g}, got {value!r}"
                f"{f' ({hint})' if hint else ''}."
            )

    most = f"{high:,.0f}" if high < 1e15 else f"{high:g}"
    least = f"≥ {low:g}" if low else "> 0"
    return Rule(check, f"number {least}, ≤ {most}{', None' if optional else ''}")


def _flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(
            f"{name} must be True or False, got {value!r} (a string like 'no' would count as "
            f"true). Pass {name}=True or {name}=False."
        )


def _directory(name: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, (str, PathLike)) or str(value) == "":
        raise ConfigError(
            f"{name} must be a folder path (str or pathlib.Path), got {value!r}. Pass e.g. "
            f"{name}='runs/exp1', or leave it out for the default."
        )
    check_creatable(value, name)


def _policy(name: str, value: object) -> None:
    if callable(value) and not isinstance(value, type):
        return
    if isinstance(value, tuple) and all(
        isinstance(t, type) and issubclass(t, Module) for t in value
    ):
        return
    raise ConfigError(
        f"{name} must be a tuple of module classes, e.g. (nn.TransformerEncoderLayer,), or a "
        f"predicate module -> bool; got {value!r}. A list or a class name as text are not "
        "accepted: write a tuple of the classes themselves."
    )


def _checkpoint_dir(name: str, value: object) -> None:
    if is_url(value):
        check_location(str(value), name)
    elif looks_mangled(value):
        raise ConfigError(
            f"{name}={str(value)!r} looks like a URL with one slash after the protocol (a typo, "
            "or a URL that went through pathlib.Path, which merges the // of 's3://'). Pass the "
            f"URL as a str with both slashes, e.g. {name}='s3://bucket/run1', or a local folder "
            "as './name'."
        )
    else:
        _directory(name, value)


def _storage_options(name: str, value: object) -> None:
    if value is not None and not (
        isinstance(value, dict) and all(isinstance(k, str) for k in value)
    ):
        raise ConfigError(  # the value is not shown: it may hold credentials
            f"{name} must be None or a dict of fsspec options with str keys, e.g. "
            f"{{'endpoint_url': 'http://127.0.0.1:9000'}}; got a {type(value).__name__}."
        )


def _device_ids(name: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        raise ConfigError(
            f"{name} must be None or a list of GPU indices like [0, 1], got {value!r}."
        )


def _mapping(name: str, value: object) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a dict of your own values, got {value!r}.")


FLAG = Rule(_flag, "`True`, `False`")
FOLDER = Rule(_directory, "folder path (str, Path) that can be made, None")
POLICY = Rule(_policy, "tuple of module classes, or a predicate")
_RULES: dict[str, Rule] = {
    "strategy": _choice(("auto", *STRATEGY_NAMES)),
    "accelerator": _choice(ACCELERATORS),
    "backend": _choice(BACKENDS, optional=True),
    "precision": _choice(PRECISIONS),
    "grad_accum": _whole(low=1, high=2**20, hint="1 steps after every micro-batch"),
    "global_batch": _whole(low=1, optional=True),
    "per_rank_batch": _whole(low=1, optional=True),
    "max_grad_norm": _number(high=1e30, optional=True, hint="e.g. 1.0; None does not clip"),
    "seed": _whole(low=0, high=2**63 - 1, hint="e.g. seed=0; int(time.time()) for a fresh one"),
    "run_dir": FOLDER,
    "ckpt_dir": Rule(
        _checkpoint_dir, "folder path (str, Path) that can be made, fsspec URL (str), None"
    ),
    "ckpt_storage_options": Rule(_storage_options, "dict of fsspec options, None"),
    "keep_last": _whole(low=1, optional=True, hint="None keeps every checkpoint"),
    "async_save": FLAG,
    "previous_run": _choice(PREVIOUS_RUN),
    "preempt_signals": Rule(_check_signals, "None, or a tuple of signal names (`'SIGTERM'`, ...)"),
    "preempt_grace_s": Rule(_check_grace, "a number of seconds > 0"),
    "stats_every": _whole(low=1, optional=True, hint="None writes no stats"),
    "tensorboard": FLAG,
    "log_to": Rule(check_log_to, "`tensorboard`, `mlflow`, `wandb`, a list of them, None"),
    "tracker_project": Rule(check_project, "name of 1-256 characters"),
    "tracker_run_name": Rule(check_run_name, "name of 1-128 characters, None"),
    "mlflow_tracking_uri": Rule(check_uri, "tracking URI (str), None"),
    "progress": FLAG,
    "profile": Rule(check_profile_setting, "`True`, `pt.Profile(...)`, dict of its fields, None"),
    "timeout_s": _number(
        high=30 * 86400,
        low=1.0,
        hint="seconds: no collective, not even a process group's first one, completes in less "
        "than one; at most 30 days",
    ),
    "watchdog": FLAG,
    "stall_s": _number(
        high=30 * 86400, low=1.0, optional=True, hint="None adapts it to the step time"
    ),
    "device_ids": Rule(_device_ids, "list of GPU indices, None"),
    "sync_batchnorm": FLAG,
    "find_unused_parameters": FLAG,
    "broadcast_buffers": FLAG,
    "static_graph": FLAG,
    "comm_hook": _choice(COMM_HOOKS, optional=True),
    "powersgd_rank": _whole(low=1, high=1024, hint="1 to 4 is usual"),
    "powersgd_warmup": _whole(low=2, high=2**31, hint="at least 2 steps"),
    "fsdp_wrap": POLICY,
    "fsdp_reshard_after_forward": FLAG,
    "fsdp_offload": FLAG,
    "mesh": Rule(
        check_mesh_setting, "dict of axis (`pp`, `dp_replicate`, `dp`, `tp`) to size, None"
    ),
    "tp_plan": Rule(
        check_tp_plan, "`auto`, dict of name pattern to style, `paratrain.tp` plan, None"
    ),
    "pipeline_split": Rule(
        check_split_setting, "tuple of layer names, function (model, stage, stages) -> module, None"
    ),
    "pipeline_schedule": _choice(PIPELINE_SCHEDULES),
    "pipeline_stages": _whole(low=1, high=4096, optional=True),
    "n_microbatches": _whole(low=1, high=2**20, optional=True),
    "activation_checkpointing": POLICY,
    "num_workers": _whole(low=0, high=1024, optional=True),
    "extra": Rule(_mapping, "dict"),
}
"""One rule per setting (a test asserts that every field has one)."""
_CHECKS: dict[str, Callable[[str, object], None]] = {k: r.check for k, r in _RULES.items()}


def _field_docs() -> dict[str, str]:
    """Each RunConfig field's docstring, as one line of Markdown."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(RunConfig)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        named = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if named and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            text = " ".join(str(after.value.value).split())
            text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
            docs[node.target.id] = text.replace("|", "\\|")
    return docs


def settings_table() -> str:
    """The settings table of docs/reference/settings.md: the fields, their defaults, rules and
    docstrings."""
    docs = _field_docs()
    rows = ["| setting | default | allowed | meaning |", "|---|---|---|---|"]
    for f in fields(RunConfig):
        default = f.default if f.default_factory is MISSING else f.default_factory()
        rows.append(f"| `{f.name}` | `{default!r}` | {_RULES[f.name].allowed} | {docs[f.name]} |")
    return "\n".join(rows) + "\n"
