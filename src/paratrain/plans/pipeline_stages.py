"""Pipeline stages: which layers each stage holds, cut from the user's model with names kept.

    layers = spine(model)                                  # [("0", Linear), ("1", ReLU), ...]
    stages = plan_stages(model, split=("4",), stages=2)    # [["0", ..., "3"], ["4", ...]]
    first = stage_module(model, stages[0])                 # the model with those layers only

A model made of ``nn.Sequential`` containers (nested ones too) is cut anywhere along its
*spine*: the layers its forward runs one after another. ``split`` names the layers where new
stages begin (``("layers.4", "layers.8")``); without it the layers are dealt out so that the
stages hold about the same number of parameters. Each stage is a pruned copy of the containers
holding the user's own layer objects, so parameter names stay those of the whole model: a
checkpoint written by a pipeline loads anywhere else, and the other way round.

Any other model is split by a function the user writes, ``split(model, stage, stages) ->
nn.Module``, which returns the part of the model for that stage with the model's own parameter
names (e.g. a copy with the other blocks deleted and a forward that skips missing parts, as
torchtitan does).
"""

from __future__ import annotations

import difflib
import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence

from torch import nn

from paratrain.errors import ConfigError, ModelError

StageBuilder = Callable[[nn.Module, int, int], nn.Module]
"""``split(model, stage, stages)``: the module of stage ``stage`` (0-based) of ``stages``."""
SplitSetting = tuple[str, ...] | StageBuilder
"""What ``pipeline_split`` accepts: layer names where stages begin, or a stage builder."""


def check_split_setting(name: str, value: object) -> None:
    """The config-time check of ``pipeline_split``."""
    if value is None or (callable(value) and not isinstance(value, type)):
        return
    if isinstance(value, str) or not (
        isinstance(value, (tuple, list)) and all(isinstance(v, str) and v for v in value)
    ):
        raise ConfigError(
            f"{name} must be None (balanced stages), a tuple of layer names where new stages "
            f"begin, e.g. {name}=('layers.4',), or a function (model, stage, stages) -> module; "
            f"got {value!r}."
        )
    if len(set(value)) != len(value):
        raise ConfigError(f"{name}={tuple(value)!r} names a layer twice. Name each split once.")


def spine(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The layers an ``nn.Sequential`` runs in order, nested Sequentials flattened, by name."""
    if type(model) is not nn.Sequential:
        raise ModelError(
            f"pipeline_split by layer names needs an nn.Sequential model (the layers its forward "
            f"runs in order), but this is a {type(model).__name__}, whose forward paratrain "
            "cannot cut. Build the model as nn.Sequential(...), or pass pipeline_split=a "
            "function (model, stage, stages) -> the module of that stage, keeping the model's "
            "parameter names (see paratrain.plans.pipeline_stages)."
        )
    layers: list[tuple[str, nn.Module]] = []

    def walk(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if type(child) is nn.Sequential:
                walk(child, path + ".")
            else:
                layers.append((path, child))

    walk(model, "")
    return layers


def plan_stages(model: nn.Module, split: Sequence[str] | None, stages: int) -> list[list[str]]:
    """The layer names of each of ``stages`` stages (``split``: where stages 2.. begin)."""
    layers = spine(model)
    names = [name for name, _ in layers]
    if len(layers) < stages:
        raise ModelError(
            f"The pipeline has {stages} stages but the model has {len(layers)} layers along "
            f"its nn.Sequential ({', '.join(names)}); every stage needs at least one. Use "
            f"fewer stages (a smaller pp axis, fewer stages per rank) or a deeper model."
        )
    if split is None:
        starts = _balanced(model, layers, stages)
    else:
        if len(split) + 1 != stages:
            raise ModelError(
                f"pipeline_split={tuple(split)!r} makes {len(split) + 1} stages, but the "
                f"pipeline runs {stages} (pp size x stages per rank). Name {stages - 1} split "
                f"points, or leave pipeline_split out for balanced stages."
            )
        starts = [0, *(_position(name, names) for name in split)]
        if starts != sorted(starts) or 0 in starts[1:]:
            raise ModelError(
                f"pipeline_split={tuple(split)!r} must name layers after the first, in the "
                f"order the model runs them ({', '.join(names)}): each name begins the next "
                "stage."
            )
    bounds = [*starts, len(names)]
    return [names[a:b] for a, b in itertools.pairwise(bounds)]


def _position(name: str, names: list[str]) -> int:
    """Where ``name`` (a layer, or a nested Sequential: its first layer) begins in ``names``."""
    for index, layer in enumerate(names):
        if layer == name or layer.startswith(name + "."):
            return index
    close = difflib.get_close_matches(name, names, n=3)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ModelError(
        f"pipeline_split names {name!r}, which is not a layer of the model.{hint} Layers, in "
        f"order: {', '.join(names)}."
    )


def _balanced(model: nn.Module, layers: list[tuple[str, nn.Module]], stages: int) -> list[int]:
    """Stage starts that give each stage about the same number of parameters (>= 1 layer)."""
    sizes = [sum(p.numel() for p in layer.parameters()) for _, layer in layers]
    total = sum(sizes) or 1
    starts = [0]
    running = 0
    for index, size in enumerate(sizes):
        stage = len(starts)
        if stage == stages:
            break
        left = len(layers) - index  # layers from here on, including this one
        must_cut = left == stages - stage  # one layer per remaining stage from here
        if index > starts[-1] and (must_cut or running + size / 2 > total * stage / stages):
            starts.append(index)
        running += size
    return starts


def stage_module(model: nn.Module, layers: Sequence[str]) -> nn.Module:
    """``model`` with only ``layers`` (names from :func:`spine`): new Sequential containers,
    the user's layer objects, so names and parameters are the model's own."""
    keep = set(layers)

    def prune(module: nn.Module, prefix: str) -> nn.Module | None:
        children: OrderedDict[str, nn.Module] = OrderedDict()
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if type(child) is nn.Sequential:
                pruned = prune(child, path + ".")
                if pruned is not None:
                    children[name] = pruned
            elif path in keep:
                children[name] = child
        if not children:
            return None
        pruned_module = nn.Sequential(children)
        pruned_module.train(module.training)
        return pruned_module

    pruned = prune(model, "")
    assert pruned is not None, "every stage holds at least one layer"
    return pruned


def built_stage(builder: StageBuilder, model: nn.Module, stage: int, stages: int) -> nn.Module:
    """Call the user's stage builder and check that it kept the model's parameter names."""
    module = builder(model, stage, stages)
    if not isinstance(module, nn.Module):
        raise ModelError(
            f"pipeline_split returned {type(module).__name__} for stage {stage}; it must "
            "return the nn.Module that runs that stage."
        )
    known = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    own = [name for name, _ in module.named_parameters(remove_duplicate=False)]
    foreign = [name for name in own if name not in known]
    if foreign:
        raise ModelError(
            f"The module pipeline_split built for stage {stage} has parameters the model does "
            f"not have by those names ({', '.join(foreign[:3])}). Keep the model's names (delete "
            "the other stages' layers from a copy of the model, instead of wrapping or "
            "renaming), so checkpoints load under any layout."
        )
    for group in _tied_names(model):
        held = [name for name in group if name in own]
        missing = [name for name in group if name not in own]
        if held and missing:
            raise ModelError(
                f"{held[0]!r} and {missing[0]!r} are one tied parameter, but the stage "
                f"pipeline_split built for stage {stage} holds {held[0]!r} without "
                f"{missing[0]!r}: tied weights cannot span pipeline stages, which live on "
                "different ranks. Keep both layers in one stage, or untie them (give the layer "
                "its own copy: nn.Parameter(weight.detach().clone()))."
            )
    return module


def _tied_names(model: nn.Module) -> list[list[str]]:
    """Names that share one parameter (an embedding tied to the output layer)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def check_untied(stages: list[nn.Module], indices: list[int]) -> None:
    """Refuse a parameter held by two stages (tied weights cannot span pipeline stages)."""
    owner: dict[int, tuple[int, str]] = {}
    for module, index in zip(stages, indices, strict=True):
        for name, param in module.named_parameters(remove_duplicate=False):
            first = owner.setdefault(id(param), (index, name))
            if first[0] != index:
                raise ModelError(
                    f"Parameter {first[1]!r} of stage {first[0]} is also {name!r} of stage "
                    f"{index}: tied weights cannot span pipeline stages, which live on "
                    "different ranks. Put both layers in one stage (move the split), or untie "
                    "them."
                )
