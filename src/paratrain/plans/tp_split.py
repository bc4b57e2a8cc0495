"""Split a model's layers by a resolved tensor-parallel plan, refusing plans that cannot be right.

    resolved = tp.resolve(model, plan, tp_size)
    notes = split(model, resolved, mesh["tp"])     # every rank of the tp group

Before anything is split, each column-wise layer that hands on a local shard of its outputs
must have a row-wise partner in the module that holds it (until that partner sums it, the
activation is split over the tp ranks), and each row-wise layer that takes a split input a
column-wise one; styles whose layouts say otherwise (``output``, outputs gathered, sequence
parallel, ``PrepareModuleInput``) need no partner. Tied parameters (an embedding shared
with the output layer) stay one parameter when the plan splits both sides the same way; a plan
that splits them differently is refused.

What cannot be seen in the module tree, what a block's forward does between a pair, is checked
on the block's first call: one block of each shape (``blocks.*.attn``, ``blocks.*.mlp``) is
kept twice before the split, whole and split by the same plan, and both copies run on the
block's real first input (evaluation mode, fp32, no autocast); blocks holding a style with
layouts of its own are not compared. Split heads that the forward
does not know about (``view(B, T, self.n_heads, -1)`` with the whole model's head count) and a
norm, softmax or mean over the features between a pair give outputs that differ from the whole
block's; the call then raises ModelError naming the block and the fix, before any step. The
copies are dropped after that call.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten, tree_map

from paratrain.errors import ModelError
from paratrain.plans.tp import Resolved

HEAD_COUNT = re.compile(r"(^|_)(n|num)_?(kv_|key_value_|attention_)?heads?$|^n?heads?$|^nhead$")
"""Names of int attributes that hold a head count (``n_heads``, ``num_kv_heads``, ``nhead``)."""
TOLERANCE = 1e-3
"""Largest difference between the split and the whole block, relative to the whole block's
largest output (at least 1): fp32 summation order stays near 1e-6."""


_STAND_IN = contextvars.ContextVar("paratrain_tp_stand_in", default=False)


@contextlib.contextmanager
def stand_in() -> Iterator[None]:
    """Calls inside run on stand-in tensors (a pipeline stage learning its shapes on
    uninitialised memory): the first-call check waits for a real input."""
    token = _STAND_IN.set(True)
    try:
        yield
    finally:
        _STAND_IN.reset(token)


def split(model: nn.Module, resolved: Resolved, mesh: Any) -> list[str]:
    """Check ``resolved`` against ``model``, divide the head counts, split the layers over
    ``mesh`` (the tp axis), keep tied parameters tied and arm the first-call check. Returns
    notes to print (a block that cannot be copied is not compared, and says so)."""
    from torch.distributed.tensor.parallel import parallelize_module

    kinds = {name: _kind(style) for name, style in resolved.styles.items()}
    check_pairs(model, resolved.styles)
    ties = _ties(model)
    blocks, notes = {}, []
    whole: dict[str, nn.Module] = {}
    for name, block in _blocks(model, kinds).items():
        try:
            whole[name] = copy.deepcopy(block)
            blocks[name] = block
        except Exception as err:  # a reference deepcopy cannot follow (a lock, a process group)
            notes.append(
                f"paratrain: tp_plan: {name or 'the model'!r} is not compared with its unsplit "
                f"copy on its first call: it cannot be copied ({type(err).__name__}: {err})"
            )
    for module, _, attr in resolved.heads:
        setattr(module, attr, getattr(module, attr) // _size(mesh))
    probes = []
    for name, block in blocks.items():
        inner = {
            n[len(name) + 1 :] if name else n: s
            for n, s in resolved.styles.items()
            if _inside(n, name)
        }
        cut = copy.deepcopy(block)
        parallelize_module(cut, mesh, inner)
        divided = {attr for m, n, attr in resolved.heads if _inside(n, name) or n == name}
        probes.append(_Probe(name, block, whole[name], cut, kinds, divided))
    parallelize_module(model, mesh, resolved.styles)
    _retie(model, ties, kinds)
    for probe in probes:
        probe.arm()
    return notes


def _size(mesh: Any) -> int:
    return int(mesh.size())


def _kind(style: Any) -> str | None:
    """``colwise``/``rowwise`` for those styles with torch's default layouts; None for any other
    (``sequence``, ``output``, a ParallelStyle with layouts of its own: trusted as written)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if type(style) is ColwiseParallel:
        default = style.output_layouts == (Shard(-1),) and style.use_local_output
        return "colwise" if default and style.input_layouts == (Replicate(),) else None
    if type(style) is RowwiseParallel:
        whole_out = style.output_layouts == (Replicate(),) and style.use_local_output
        return "rowwise" if whole_out else None
    return None


def _role(style: Any) -> str | None:
    """What a style needs from a partner: ``colwise`` hands on a local shard of its outputs
    (a rowwise layer must sum it), ``rowwise`` takes a split input (a colwise layer must make
    it); None for styles whose outputs are whole or a DTensor (``output``, ``Replicate()``
    outputs), inputs taken whole, ``sequence``, and any other ParallelStyle."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if isinstance(style, ColwiseParallel):
        local_shard = style.output_layouts == (Shard(-1),) and style.use_local_output
        return "colwise" if local_shard else None
    if isinstance(style, RowwiseParallel):
        return "rowwise" if style.input_layouts == (Shard(-1),) else None
    return None


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def _inside(name: str, block: str) -> bool:
    return block == "" or name.startswith(block + ".")


def _beside(name: str, parent: str) -> bool:
    """``name`` is in ``parent``'s subtree; at the model's top level, a direct child (a layer
    deep inside a block is no partner for a top-level head)."""
    return _inside(name, parent) if parent else "." not in name


def check_pairs(model: nn.Module, styles: dict[str, Any]) -> None:
    """Refuse a column-wise layer with no row-wise one beside it in its module, and a row-wise
    Linear with no column-wise one: the split activation would reach code that expects it whole.
    ``styles``: module name -> ParallelStyle, as ``parallelize_module`` takes them."""
    kinds = {name: _role(style) for name, style in styles.items()}
    modules = dict(model.named_modules())
    for name, kind in kinds.items():
        if kind is None:
            continue
        layer = modules[name]
        if kind == "rowwise" and isinstance(layer, nn.Embedding):
            continue  # split over its rows (the vocabulary): whole outputs, needs no partner
        partner = "rowwise" if kind == "colwise" else "colwise"
        parent = _parent(name)
        if any(k == partner and _beside(n, parent) for n, k in kinds.items()):
            continue
        where = f"{parent!r}" if parent else "the model"
        if kind == "colwise":
            raise ModelError(
                f"tp_plan makes {name!r} colwise, but no layer in {where} is rowwise: its output "
                "would stay split over the tp ranks (each rank holds 1/tp of its features) and "
                "the code after it expects the whole activation. Pair it with the Linear that "
                f"consumes it, e.g. {{{name!r}: 'colwise', '<next Linear>': 'rowwise'}}, or "
                "leave it out of the plan. A model's output layer splits with "
                f"paratrain.tp.output({name!r}) (its logits stay split for the loss)."
            )
        raise ModelError(
            f"tp_plan makes {name!r} rowwise, but no layer in {where} is colwise: a rowwise "
            "Linear takes its input split over the tp ranks, and nothing splits it. Pair it with "
            "the Linear that feeds it (colwise), or leave it out of the plan."
        )


# -- tied parameters -------------------------------------------------------------------------


def _ties(model: nn.Module) -> list[list[tuple[str, str]]]:
    """Groups of (module name, attribute) that hold one parameter object."""
    holders: dict[int, list[tuple[str, str]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for attr, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((name, attr))
    return [group for group in holders.values() if len(group) > 1]


def _layout(param: torch.Tensor) -> Any:
    if isinstance(param, DTensor):
        return (param.device_mesh, tuple(param.placements))
    return None


def _retie(
    model: nn.Module, ties: list[list[tuple[str, str]]], kinds: dict[str, str | None]
) -> None:
    """Make each tied group one parameter again (``parallelize_module`` gave each side its own),
    or refuse a plan that splits the sides differently."""
    modules = dict(model.named_modules(remove_duplicate=False))
    for group in ties:
        params = [modules[m]._parameters[a] for m, a in group]
        assert all(p is not None for p in params)
        first = params[0]
        assert first is not None
        if all(_layout(p) == _layout(first) for p in params if p is not None):
            for module_name, attr in group[1:]:
                modules[module_name]._parameters[attr] = first
            continue
        names = [f"{m}.{a}" if m else a for m, a in group]
        how = ", ".join(
            f"{n} {'whole' if _layout(p) is None else _placements(p)}"
            for n, p in zip(names, params, strict=True)
            if p is not None
        )
        raise ModelError(
            f"{' and '.join(map(repr, names))} are one tied parameter, but tp_plan splits them "
            f"differently ({how}): they would become two parameters that train apart. Split "
            "every side the same way: an Embedding tied to the output Linear splits with it when "
            "the Embedding is 'rowwise' (its vocabulary rows) and the Linear 'colwise' or "
            "'output' (its vocabulary outputs); or leave both out of the plan."
        )


def _placements(param: torch.Tensor) -> str:
    assert isinstance(param, DTensor)
    return "split " + "/".join(str(p) for p in param.placements)


# -- the first-call check ----------------------------------------------------------------------


def _blocks(model: nn.Module, kinds: dict[str, str | None]) -> dict[str, nn.Module]:
    """The first module of each shape that holds a column-wise layer (its parent), when every
    layer the plan splits inside it has torch's default layouts: a block with a style of its own
    inside (sequence parallel, outputs left split) may hand on something else on purpose."""
    modules = dict(model.named_modules())
    found: dict[str, str] = {}
    for name, kind in kinds.items():
        if kind == "colwise":
            parent = _parent(name)
            found.setdefault(re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)", "*", parent), parent)
    return {
        parent: modules[parent]
        for parent in found.values()
        if parent not in kinds
        and all(k is not None for n, k in kinds.items() if _inside(n, parent))
    }


class _Probe:
    """Runs a block's whole and split copies on its first real input and compares them."""

    def __init__(
        self,
        name: str,
        block: nn.Module,
        whole: nn.Module,
        cut: nn.Module,
        kinds: dict[str, str | None],
        divided: set[str],
    ) -> None:
        self.name = name
        self.block = block
        self.whole: nn.Module | None = whole
        self.cut: nn.Module | None = cut
        self.pairs = [n for n, k in kinds.items() if k is not None and _inside(n, name)]
        self.divided = divided
        self.handle: Any = None
        self.group = _group_of(cut)

    def arm(self) -> None:
        self.handle = self.block.register_forward_pre_hook(self._first_call, with_kwargs=True)

    def _first_call(self, _module: nn.Module, args: Any, kwargs: Any) -> None:
        if self.whole is None or self.cut is None or _STAND_IN.get():
            return
        if not self._agree(_finite((args, kwargs))):
            return  # a pipeline's shape-finding pass on stand-in memory: the next call
        try:
            self._compare(args, kwargs)
        finally:
            self.handle.remove()
            self.whole = self.cut = None

    def _agree(self, ok: bool) -> bool:
        """Every rank of the tp group decides alike (the split copy's forward is collective)."""
        if self.group is None:
            return ok
        assert self.cut is not None
        device = next(self.cut.parameters()).device  # nccl reduces only GPU tensors
        flag = torch.tensor([1.0 if ok else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    def _compare(self, args: Any, kwargs: Any) -> None:
        assert self.whole is not None and self.cut is not None
        device = next(self.whole.parameters()).device
        devices = [device] if device.type == "cuda" else []
        with (
            torch.random.fork_rng(devices=devices),  # the training's random streams untouched
            torch.no_grad(),
            torch.autocast(device.type, enabled=False),
            _eval(self.whole),
            _eval(self.cut),
        ):
            try:
                expected = self.whole(*_whole(args), **_whole(kwargs))
                again = self.whole(*_whole(args), **_whole(kwargs))
            except Exception:  # the real call raises it, as it would unsplit
                return
            if _diff(expected, again) != 0.0:
                return  # random even in evaluation mode: nothing to compare
            try:
                got = self.cut(*_fp32(args), **_fp32(kwargs))
            except (RuntimeError, ValueError) as err:
                raise ModelError(self._wrong(f"fails when split: {_first_line(err)}")) from None
        diff = _diff(expected, got)
        scale = max(1.0, _largest(expected))
        if not diff <= TOLERANCE * scale:
            raise ModelError(
                self._wrong(f"computes something else when split (max |difference| {diff:.2g})")
            )

    def _wrong(self, what: str) -> str:
        heads = {
            attr: value
            for attr, value in vars(self.block).items()
            if isinstance(value, int)
            and not isinstance(value, bool)
            and HEAD_COUNT.search(attr.lower())
            and attr not in self.divided
        }
        pairs = ", ".join(self.pairs)
        if heads:
            counts = ", ".join(f"self.{a} = {v}" for a, v in heads.items())
            why = (
                f"Each rank holds 1/tp of the heads of {pairs}, but its forward still reads "
                f"{counts}, the whole model's count. Plan it with paratrain.tp.attention("
                f"{self.name!r}, q=..., k=..., v=..., out=..., heads={tuple(heads)!r}), "
                "which divides the count by the tp size, or make the forward infer the heads "
                "from the tensor (view(B, T, -1, head_dim)) and pass heads=()."
            )
        else:
            why = (
                f"Between the colwise and rowwise layers of {pairs}, its forward does more than "
                "elementwise work (a norm, softmax or mean over the features, a reshape that "
                "mixes them, a layer outside the plan), which sees 1/tp of the features on each "
                "rank. Split only pairs joined by elementwise code (activations, dropout, "
                "products), or leave this block out of the plan."
            )
        return f"tp_plan: the block {self.name or 'the model'!r} {what}. {why}"


def _group_of(module: nn.Module) -> Any:
    for param in module.parameters():
        if isinstance(param, DTensor) and dist.is_initialized():
            return param.device_mesh.get_group()
    return None


class _eval:
    """Evaluation mode for a block, restored after."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.modes: list[bool] = []

    def __enter__(self) -> None:
        self.modes = [m.training for m in self.module.modules()]
        self.module.eval()

    def __exit__(self, *_: object) -> None:
        for module, mode in zip(self.module.modules(), self.modes, strict=True):
            module.training = mode


def _map(fn: Callable[[torch.Tensor], Any], tree: Any) -> Any:
    return tree_map(lambda v: fn(v) if isinstance(v, torch.Tensor) else v, tree)


def _to32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.is_floating_point() else t


def _fp32(tree: Any) -> Any:
    return _map(lambda t: _to32(t.detach()), tree)


def _whole(tree: Any) -> Any:
    return _map(lambda t: _to32(_gathered(t.detach())), tree)


def _gathered(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _tensors(tree: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(tree)
    return [
        _gathered(v).float()
        for v in leaves
        if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())
    ]


def _finite(tree: Any) -> bool:
    leaves, _ = tree_flatten(tree)
    for v in leaves:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            local = v.to_local() if isinstance(v, DTensor) else v
            if not bool(torch.isfinite(local).all()):
                return False
    return True


def _diff(a: Any, b: Any) -> float:
    left, right = _tensors(a), _tensors(b)
    if len(left) != len(right) or any(x.shape != y.shape for x, y in zip(left, right, strict=True)):
        return float("inf")
    return max((float((x - y).abs().max()) for x, y in zip(left, right, strict=True)), default=0.0)


def _largest(tree: Any) -> float:
    return max((float(t.abs().max()) for t in _tensors(tree) if t.numel()), default=0.0)


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
