"""Tensor-parallel plans: which layers of a model are split over the ``tp`` axis, and how.

    import paratrain as pt
    plan = pt.tp.mlp("blocks.*.mlp", up="fc1", down="fc2") | pt.tp.attention(
        "blocks.*.attn", q="q_proj", k="k_proj", v="v_proj", out="o_proj", heads=("n_heads",))
    with pt.Run(strategy="tp", mesh={"dp": -1, "tp": 2}, tp_plan=plan) as run: ...

    pt.Run(strategy="tp", tp_plan={"net.0": "colwise", "net.2": "rowwise"})   # by hand
    pt.Run(strategy="tp", tp_plan="auto")   # the MLPs whose forward paratrain knows

A plan maps module-name patterns (``*`` matches one name part, as in ``parallelize_module``) to a
style: ``colwise`` splits a Linear's outputs (each rank computes some features), ``rowwise`` its
inputs (partial results summed over the group), ``sequence`` runs a norm or dropout on a
sequence shard, ``output`` splits the last Linear over its classes (the vocabulary) and keeps the
logits split for a cross-entropy computed on the shards (loss parallel, see :func:`output`); any
DTensor ``ParallelStyle`` object is passed through. A colwise layer must
feed the rowwise one through elementwise code only (an activation, dropout, a product of two
colwise outputs): that is what :func:`mlp` and :func:`attention` build.

:func:`attention` also divides the block's head-count attributes by the tp size, because a rank
sees ``heads / tp`` heads of q, k and v and a forward that reshapes with ``self.n_heads`` must
use the local count. ``"auto"`` splits only what it can prove safe: ``nn.Sequential`` runs of
Linear → elementwise modules → Linear, and the feed-forward of ``nn.TransformerEncoderLayer`` /
``nn.TransformerDecoderLayer``; it prints what it chose and fails when it finds nothing.
"""

from __future__ import annotations

import difflib
import fnmatch
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from paratrain.errors import ConfigError, ModelError

STYLES = ("colwise", "rowwise", "sequence", "output")
"""Style names a plan may use instead of ParallelStyle objects."""
_ELEMENTWISE = (
    nn.ReLU,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.LeakyReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.Mish,
    nn.Softplus,
    nn.Hardswish,
    nn.Hardtanh,
    nn.ReLU6,
    nn.Dropout,
    nn.Identity,
)


@dataclass(frozen=True)
class TPPlan:
    """Module-name pattern → style, and the head-count attributes to divide by the tp size."""

    styles: dict[str, Any]
    heads: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __or__(self, other: TPPlan | Mapping[str, Any]) -> TPPlan:
        other = other if isinstance(other, TPPlan) else TPPlan(dict(other))
        clash = sorted(set(self.styles) & set(other.styles))
        if clash:
            raise ConfigError(
                f"Both plans set a style for {', '.join(map(repr, clash))}. Give each module one "
                "style: drop it from one of the plans."
            )
        return TPPlan({**self.styles, **other.styles}, {**self.heads, **other.heads})


PlanSetting = TPPlan | Mapping[str, Any] | str
"""What ``RunConfig.tp_plan`` takes: a plan, a dict of pattern to style, or ``"auto"``."""


def mlp(block: str, *, up: str | Iterable[str] = "fc1", down: str = "fc2") -> TPPlan:
    """Split an MLP block: the ``up`` Linears (a gated MLP has two, e.g. ``("w1", "w3")``)
    column-wise, ``down`` row-wise. ``block`` is the module name or pattern holding them."""
    ups = [up] if isinstance(up, str) else list(up)
    styles: dict[str, Any] = {_join(block, u): "colwise" for u in ups}
    styles[_join(block, down)] = "rowwise"
    return TPPlan(styles)


def attention(
    block: str,
    *,
    q: str = "q_proj",
    k: str = "k_proj",
    v: str = "v_proj",
    out: str = "o_proj",
    heads: Iterable[str] = ("n_heads", "num_heads", "n_head"),
) -> TPPlan:
    """Split an attention block with separate q, k, v projections (column-wise: each rank gets
    whole heads) and an output projection (row-wise). ``heads`` names the block's attributes
    that hold head counts (``n_kv_heads`` too, for grouped-query attention); each one present is
    divided by the tp size. A fused qkv projection cannot be split this way: split it in three.
    """
    styles = {_join(block, name): "colwise" for name in (q, k, v)}
    styles[_join(block, out)] = "rowwise"
    return TPPlan(styles, {block: tuple(heads)})


def output(name: str = "lm_head") -> TPPlan:
    """Split the output Linear ``name`` over its classes and compute the cross-entropy on the
    shards (loss parallel): no rank ever holds the whole ``batch x classes`` logits.

    The loss is parallel where paratrain computes it (``run.setup(..., loss_fn=F.cross_entropy)``
    and ``model(x, target=y)``) or where the model's own forward does; outputs handed back to
    your code are gathered into whole tensors, so ``criterion(model(x), y)`` and ``argmax``
    still work, without the saving. ``loss_fn`` must be ``cross_entropy`` or ``nll_loss``
    (over the last dimension), the ops torch's ``loss_parallel`` implements."""
    return TPPlan({name: "output"})


def _join(block: str, name: str) -> str:
    return f"{block}.{name}" if block else name


def check_tp_plan(name: str, value: object) -> None:
    """The config-time check (no model yet): the plan's shape and style names."""
    if value is None or value == "auto" or isinstance(value, TPPlan):
        return
    if isinstance(value, Mapping) and value:
        for pattern, style in value.items():
            if not isinstance(pattern, str) or not pattern:
                raise ConfigError(f"{name} keys must be module names or patterns, got {pattern!r}.")
            if not (style in STYLES or _is_parallel_style(style)):
                raise ConfigError(
                    f"{name}[{pattern!r}] is {style!r}. Styles: {', '.join(STYLES)}, or a "
                    "torch.distributed.tensor.parallel ParallelStyle (ColwiseParallel(...))."
                )
        return
    raise ConfigError(
        f"{name} must be 'auto', a dict of module name pattern to style (e.g. {{'mlp.fc1': "
        "'colwise', 'mlp.fc2': 'rowwise'}), or a plan from paratrain.tp (mlp, attention); "
        f"got {value!r}."
    )


def _is_parallel_style(value: object) -> bool:
    style = sys.modules.get("torch.distributed.tensor.parallel.style")
    return style is not None and isinstance(value, style.ParallelStyle)


@dataclass(frozen=True)
class Resolved:
    """A plan applied to one model: exact module names → ParallelStyle objects."""

    styles: dict[str, Any]
    heads: list[tuple[nn.Module, str, str]]
    """(module, its name, attribute) whose value is divided by the tp size."""
    loss_parallel: bool = False
    """True when an ``output`` style keeps logits split: losses run under ``loss_parallel``."""


def resolve(model: nn.Module, plan: object, tp: int, *, part: bool = False) -> Resolved:
    """The plan for ``model`` at tp size ``tp``, every name checked; ModelError names the fix.

    ``part``: ``model`` is one pipeline stage of a model the plan was checked against; patterns
    that match nothing here belong to other stages."""
    modules = dict(model.named_modules())
    if plan == "auto":
        found = auto_plan(model)
        if not found.styles and not part:
            raise ModelError(
                f"tp_plan='auto' found nothing it can split in {type(model).__name__}: it "
                "recognises nn.Sequential(Linear, activation/dropout, ..., Linear) and the "
                "feed-forward of nn.TransformerEncoderLayer/DecoderLayer. Pass a plan: "
                "paratrain.tp.mlp(...), paratrain.tp.attention(...), or a dict of module name "
                "to 'colwise'/'rowwise'."
            )
    elif isinstance(plan, TPPlan):
        found = plan
    else:
        found = TPPlan(dict(plan))  # type: ignore[call-overload]
    styles: dict[str, Any] = {}
    parallel_loss = False
    for pattern, style in found.styles.items():
        parallel_loss = parallel_loss or style == "output"
        names = _matches(pattern, modules)
        if not names and not part:
            raise ModelError(_no_match(pattern, model, modules))
        for module_name in names:
            if isinstance(style, str):
                _check_divisible(module_name, modules[module_name], style, tp)
            styles[module_name] = _style(style, modules[module_name])
    heads: list[tuple[nn.Module, str, str]] = []
    for pattern, attrs in found.heads.items():
        for module_name in _matches(pattern, modules):
            heads.extend(_head_attrs(module_name, modules[module_name], attrs, tp))
    return Resolved(styles, heads, parallel_loss)


def auto_plan(model: nn.Module) -> TPPlan:
    """Colwise/rowwise pairs in modules whose forward is known to be elementwise between them."""
    styles: dict[str, Any] = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
            styles[_join(name, "linear1")] = "colwise"
            styles[_join(name, "linear2")] = "rowwise"
        elif isinstance(module, nn.Sequential):
            children = list(module.named_children())
            i = 0
            while i < len(children):
                j = i + 1
                while j < len(children) and isinstance(children[j][1], _ELEMENTWISE):
                    j += 1
                first, second = children[i][1], children[j][1] if j < len(children) else None
                if (
                    isinstance(first, nn.Linear)
                    and isinstance(second, nn.Linear)
                    and first.out_features == second.in_features
                ):
                    styles[_join(name, children[i][0])] = "colwise"
                    styles[_join(name, children[j][0])] = "rowwise"
                    i = j + 1
                else:
                    i += 1
    return TPPlan(styles)


def _matches(pattern: str, modules: Mapping[str, nn.Module]) -> list[str]:
    atoms = pattern.split(".")
    found = []
    for name in modules:
        parts = name.split(".")
        same_depth = bool(name) and len(parts) == len(atoms)
        if same_depth and all(fnmatch.fnmatchcase(p, a) for p, a in zip(parts, atoms, strict=True)):
            found.append(name)
    return found


def _no_match(pattern: str, model: nn.Module, modules: Mapping[str, nn.Module]) -> str:
    linears = [n for n, m in modules.items() if isinstance(m, (nn.Linear, nn.Embedding))]
    # compare like with like: 'layers.*.attn.q_prj' against 'layers.*.attn.q_proj'
    shapes = list(dict.fromkeys(_as_pattern(n, pattern) for n in linears))
    close = difflib.get_close_matches(pattern, shapes, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    listed = ", ".join(linears[:12]) + (", ..." if len(linears) > 12 else "")
    return (
        f"tp_plan names {pattern!r}, which matches no module of {type(model).__name__}.{hint} "
        f"Its Linear/Embedding layers: {listed or 'none'}. Use names from "
        "model.named_modules(); '*' stands for one name part (e.g. 'layers.*.mlp.fc1')."
    )


def _as_pattern(name: str, pattern: str) -> str:
    """``name`` with a '*' wherever ``pattern`` has one (same depth), else ``name``."""
    parts, atoms = name.split("."), pattern.split(".")
    if len(parts) != len(atoms):
        return name
    return ".".join("*" if a == "*" else p for p, a in zip(parts, atoms, strict=True))


def _check_divisible(name: str, module: nn.Module, style: str, tp: int) -> None:
    if style == "sequence":
        return
    if style == "output" and not isinstance(module, nn.Linear):
        raise ModelError(
            f"tp_plan makes {name!r} ({type(module).__name__}) the output layer of a parallel "
            "loss, which must be the nn.Linear that produces the logits. Name that Linear."
        )
    if not isinstance(module, (nn.Linear, nn.Embedding)):
        inner = [
            f"{name}.{n}"
            for n, m in module.named_modules()
            if n and isinstance(m, (nn.Linear, nn.Embedding))
        ]
        hint = f"Name the Linear inside it ({inner[0]!r})" if inner else "Name a Linear layer"
        raise ModelError(
            f"tp_plan makes {name!r} ({type(module).__name__}) {style}, but the colwise and "
            f"rowwise styles split nn.Linear and nn.Embedding layers. {hint}, or pass a "
            "ParallelStyle object for a custom module."
        )
    if isinstance(module, nn.Linear):
        size, what = (
            (module.out_features, "out_features")
            if style in ("colwise", "output")
            else (module.in_features, "in_features")
        )
    else:
        size, what = (
            (module.embedding_dim, "embedding_dim")
            if style == "colwise"
            else (module.num_embeddings, "num_embeddings")
        )
    if size % tp:
        raise ModelError(
            f"tp_plan makes {name!r} {style}, which splits its {what} ({size}) over tp {tp} "
            f"ranks, but {size} is not a multiple of {tp}. Choose a tp size that divides it, or "
            "leave this layer out of the plan."
        )


def _head_attrs(
    name: str, module: nn.Module, attrs: tuple[str, ...], tp: int
) -> list[tuple[nn.Module, str, str]]:
    present = [a for a in attrs if isinstance(getattr(module, a, None), int)]
    if not present and attrs:
        raise ModelError(
            f"tp.attention({name!r}) looks for the head count in {', '.join(attrs)}, but "
            f"{type(module).__name__} has none of them. Pass heads=('<attribute>',) naming the "
            "attribute its forward reshapes with, or heads=() when the forward infers the head "
            "count from the tensor (view(B, T, -1, head_dim))."
        )
    for attr in present:
        count = getattr(module, attr)
        if count % tp:
            raise ModelError(
                f"{name}.{attr} is {count} heads, not a multiple of tp {tp}: each rank must get "
                "whole heads. Choose a tp size that divides the head count."
            )
    return [(module, name, attr) for attr in present]


def _style(style: Any, module: nn.Module) -> Any:
    if not isinstance(style, str):
        return style
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    if style == "output":  # logits stay a DTensor split over the classes, for loss_parallel
        return ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    if style == "rowwise" and isinstance(module, nn.Embedding):
        # every rank looks up the same token ids in its rows: the ids are whole, not split
        return RowwiseParallel(input_layouts=Replicate())
    return {"colwise": ColwiseParallel, "rowwise": RowwiseParallel, "sequence": SequenceParallel}[
        style
    ]()
