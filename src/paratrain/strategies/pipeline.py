"""``pipeline``: the model cut into stages over the ``pp`` mesh axis, run by a schedule.

    pt.Run(strategy="pipeline")                                         # every rank one stage
    pt.Run(strategy="pipeline", pipeline_split=("6",), pipeline_schedule="gpipe")
    pt.Run(strategy="pipeline", mesh={"pp": 2, "dp": -1}, n_microbatches=8)   # pp x FSDP
    pt.Run(strategy="pipeline", pipeline_schedule="interleaved_1f1b")  # 2 stages per rank
    pt.Run(mesh={"pp": 2, "dp": -1, "tp": 2}, tp_plan="auto")        # pp x FSDP x TP

    model, optimizer = run.setup(model, optimizer, loss_fn=F.cross_entropy)
    with run.accumulate(model):
        loss = model(x, target=y)     # forward and backward of every micro-batch, in schedule
        run.backward(loss)            # nothing left to do; the loop is the same everywhere
    run.step(optimizer)

``wrap`` gives every rank rank 0's initial weights, cuts the model into stages
(:mod:`paratrain.plans.pipeline_stages`), keeps this rank's (stage ``r``, and ``r + pp``, ...
with several stages per rank), splits layers inside them with ``tp_plan`` when the mesh has a
tp axis, shards each with ``fully_shard`` over the data axes when they have more than one rank, and
returns a :class:`PipelineModel`. Its forward runs ``torch.distributed.pipelining``
(``PipelineStage`` and the GPipe, 1F1B or interleaved 1F1B schedule): training with ``target=``
runs forward and backward of ``n_microbatches`` micro-batches and returns the batch's mean loss
on every rank of the pipeline; evaluation (``model.eval()`` or ``torch.no_grad()``) runs the
forward only and returns the outputs (or the loss, given ``target=``) on every rank.

The ranks of one pipeline read the same batch (``run.data_rank``). Parameter names are the
model's own, so checkpoints are written by every rank (DCP) and load under any other layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleLoopedBFS,
)

from paratrain.config import RunConfig
from paratrain.distributed.topology import Topology
from paratrain.errors import ConfigError, ModelError
from paratrain.plans import pipeline_stages as pipeline
from paratrain.plans import tp
from paratrain.plans.mesh import MeshShape
from paratrain.plans.tp_split import stand_in
from paratrain.strategies.base import average_buffers, cpu_copies
from paratrain.strategies.fsdp import MeshStrategy, place, shard
from paratrain.strategies.tp import clip_by_global_norm, split_layers

LossFn = Callable[[Any, Any], torch.Tensor]


class PipelineStrategy(MeshStrategy):
    """Pipeline stages over ``pp``; tensor parallel inside them over ``tp`` and FSDP over the
    data-parallel axes, if the mesh has them."""

    name: ClassVar[str] = "pipeline"
    partial_model: ClassVar[bool] = True
    _data_group: Any = None
    """The ranks holding the same stages (the data axes), once ``wrap`` made the mesh."""

    @classmethod
    def mesh_shape(cls, config: RunConfig, topology: Topology) -> MeshShape:
        shape = MeshShape.resolve(config.mesh or {"pp": -1}, topology.world_size)
        if shape.sizes["tp"] > 1 and config.tp_plan is None:
            raise ConfigError(
                f"mesh={config.mesh!r} has a tp axis but no tp_plan says which layers of each "
                "stage to split. Pass tp_plan='auto' or a plan (paratrain.tp), or drop the tp "
                "axis."
            )
        if shape.sizes["tp"] == 1 and config.tp_plan is not None:
            raise ConfigError(
                f"tp_plan is set but mesh={config.mesh!r} has no tp axis to split layers over. "
                "Add one, e.g. mesh={'pp': 2, 'tp': 2}, or drop tp_plan."
            )
        if shape.sizes["pp"] == 1 and topology.world_size > 1:
            raise ConfigError(
                f"strategy 'pipeline' with mesh={config.mesh!r}: the pp axis has one rank, so "
                "every rank would hold the whole model. Give pp a size, e.g. mesh={'pp': 2, "
                "'dp': -1}, or use strategy='fsdp' for data parallelism alone."
            )
        return shape

    @classmethod
    def check(cls, config: RunConfig, topology: Topology, accelerator: str, gpus: int) -> None:
        super().check(config, topology, accelerator, gpus)
        if config.precision == "fp16":
            raise ConfigError(
                "precision='fp16' with strategy 'pipeline': loss scaling would skip steps on "
                "some stages and not others, whose weights would then disagree. Use "
                "precision='bf16' (no loss scaling needed) or 'fp32'."
            )
        pp = cls.mesh_shape(config, topology).sizes["pp"]
        stages = stage_count(config, pp)
        schedule = config.pipeline_schedule
        per_rank = stages // pp
        made = f"{_source(config)} makes {stages} stage{'s' if stages > 1 else ''}"
        if stages % pp:
            raise ConfigError(
                f"{made}, which pp {pp} does not divide: each rank holds the same number of "
                f"stages. Use {pp * max(1, stages // pp)} or {pp * (stages // pp + 1)} stages."
            )
        if schedule == "interleaved_1f1b" and per_rank < 2:
            raise ConfigError(
                f"pipeline_schedule='interleaved_1f1b' needs at least 2 stages per rank, but "
                f"{made}, {per_rank} per rank over pp {pp}. Set pipeline_stages={2 * pp}, or "
                "use pipeline_schedule='1f1b'."
            )
        if schedule != "interleaved_1f1b" and per_rank > 1:
            raise ConfigError(
                f"{made}: {per_rank} on each rank of pp {pp}, which pipeline_schedule="
                f"{schedule!r} cannot run (one stage per rank). Use pipeline_schedule="
                f"'interleaved_1f1b', or pipeline_stages={pp}."
            )
        micro = microbatches(config, stages)
        if schedule != "gpipe" and micro < stages:
            raise ConfigError(
                f"n_microbatches={micro} with pipeline_schedule={schedule!r}: 1F1B needs at "
                f"least as many micro-batches as stages ({stages}). Set n_microbatches="
                f"{stages} or more, or use pipeline_schedule='gpipe'."
            )

    def wrap(self, model: nn.Module) -> nn.Module:
        model = place(model, self.device, sync_batchnorm=self.config.sync_batchnorm)
        mesh = self.shape.build(self.device.type)
        pp = self.shape.sizes["pp"]
        stages = stage_count(self.config, pp)
        rank = mesh["pp"].get_local_rank()
        indices = list(range(rank, stages, pp))
        split = self.config.pipeline_split
        if callable(split):
            modules = [pipeline.built_stage(split, model, i, stages) for i in indices]
            pipeline.check_untied(modules, indices)
            layers = None
        else:
            layers = pipeline.plan_stages(model, split, stages)
            every = [pipeline.stage_module(model, names) for names in layers]
            pipeline.check_untied(every, list(range(stages)))
            modules = [every[i] for i in indices]
        if self.shape.sizes["tp"] > 1:
            self._split_layers(model, modules, indices, mesh)
        data = self.shape.data_submesh(mesh)
        if data is not None:
            modules = [shard(module, data, self.config) for module in modules]
            self._data_group = data.get_group() if data.ndim == 1 else data._flatten().get_group()
        micro = microbatches(self.config, stages)
        self.notes.append(
            f"paratrain: pipeline of {stages} stages over pp {pp}, schedule "
            f"{self.config.pipeline_schedule}, {micro} micro-batches per batch"
        )
        if layers is not None:
            for index, names in enumerate(layers):
                self.notes.append(
                    f"paratrain: stage {index} (pp rank {index % pp}): {_span(names)}"
                )
        return PipelineModel(
            modules,
            indices,
            stages=stages,
            schedule=self.config.pipeline_schedule,
            microbatches=micro,
            group=mesh["pp"].get_group(),
            device=self.device,
        )

    def _split_layers(
        self, model: nn.Module, modules: list[nn.Module], indices: list[int], mesh: Any
    ) -> None:
        """Tensor parallel inside each stage: the plan checked on the whole model, then applied
        to each of this rank's stages (``auto``: the pairs inside one stage)."""
        plan = self.config.tp_plan
        size = self.shape.sizes["tp"]
        whole = tp.resolve(model, plan, size)
        if whole.loss_parallel:
            raise ConfigError(
                "tp_plan has an 'output' layer (loss parallel), which strategy 'pipeline' does "
                "not run: its loss is computed inside the schedule. Drop paratrain.tp.output "
                "from the plan."
            )
        for module, index in zip(modules, indices, strict=True):
            part = tp.resolve(module, plan, size, part=True)
            _check_stage_ends_whole(module, part, index)
            self.notes.extend(split_layers(module, part, mesh["tp"], what=f"stage {index}: "))

    def check_batch(self, batch_size: int, last: int | None) -> None:
        micro = microbatches(self.config, stage_count(self.config, self.pp))
        for size, what in ((batch_size, "batch_size"), (last or micro, "last batch")):
            if size % micro:
                fix = (
                    f"a batch_size that n_microbatches={micro} divides"
                    if what == "batch_size"
                    else "drop_last=True (the short last batch is skipped)"
                )
                raise ConfigError(
                    f"run.loader's {what} of {size} samples per rank does not split into "
                    f"n_microbatches={micro} equal micro-batches for the pipeline. Pass {fix}, "
                    "or choose n_microbatches to divide it."
                )

    def sync_buffers(self, model: nn.Module) -> None:
        # Stages hold different buffers: average only over the ranks holding the same stage.
        if self._data_group is not None:
            average_buffers(model, group=self._data_group)

    def clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        """The global norm over every stage: each rank's squares summed once."""
        return clip_by_global_norm(
            params, max_norm, device=self.device, per_stage=self.shape.world_size // self.pp
        )

    @property
    def pp(self) -> int:
        return self.shape.sizes["pp"]

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """Every stage's weights, complete on the main process (a collective)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        # Not cpu_offload: with it torch keeps the state on global rank 0 only.
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        local = cpu_copies(state)
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return local
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local if self.data_rank == 0 else {})
        merged: dict[str, Any] = {}
        for part in gathered:
            merged.update(part)
        return merged


def stage_count(config: RunConfig, pp: int) -> int:
    """Stages of the whole pipeline: from ``pipeline_split``, ``pipeline_stages``, or pp (twice
    pp for the interleaved schedule)."""
    split = config.pipeline_split
    if split is not None and not callable(split):
        named = len(split) + 1
        if config.pipeline_stages is not None and config.pipeline_stages != named:
            raise ConfigError(
                f"pipeline_split={tuple(split)!r} makes {named} stages but pipeline_stages="
                f"{config.pipeline_stages}. Give one of them."
            )
        return named
    if config.pipeline_stages is not None:
        return config.pipeline_stages
    return pp * (2 if config.pipeline_schedule == "interleaved_1f1b" else 1)


def _source(config: RunConfig) -> str:
    """Which setting decided the number of stages, for an error message."""
    split = config.pipeline_split
    if split is not None and not callable(split):
        return f"pipeline_split={tuple(split)!r}"
    if config.pipeline_stages is not None:
        return f"pipeline_stages={config.pipeline_stages}"
    return f"pipeline_schedule={config.pipeline_schedule!r} by default"


def microbatches(config: RunConfig, stages: int) -> int:
    """Micro-batches per batch: ``n_microbatches``, or one per stage."""
    return config.n_microbatches if config.n_microbatches is not None else stages


def _check_stage_ends_whole(module: nn.Module, part: Any, index: int) -> None:
    """Refuse a stage whose last split layer is column-wise: its output would leave the stage
    split over the tp ranks, where the next stage expects the whole activation."""
    from torch.distributed.tensor.parallel import ColwiseParallel

    order = [name for name, _ in module.named_modules() if name in part.styles]
    if order and isinstance(part.styles[order[-1]], ColwiseParallel):
        raise ModelError(
            f"tp_plan splits {order[-1]!r} column-wise as the last split layer of pipeline "
            f"stage {index}: its output would cross to the next stage split over the tp ranks. "
            "Keep each column-wise layer in the stage of its row-wise partner (move the "
            "pipeline split), or leave the pair out of the plan."
        )


def _span(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)} layers)"


class _Stage(PipelineStage):
    """A ``PipelineStage`` whose shape-finding pass leaves buffers as they were.

    On its first step a stage runs each layer once on stand-in tensors (uninitialised memory on
    every stage but the first) to learn the shapes it sends; BatchNorm would fold those into its
    running statistics. They are saved before that pass and put back after it (not in between:
    the pass's backward still holds them)."""

    _saved_buffers: list[torch.Tensor] | None = None

    def _compute_outputs(self, *args: Any, module: nn.Module, **kwargs: Any) -> Any:
        if self._saved_buffers is None:
            self._saved_buffers = [buffer.detach().clone() for buffer in module.buffers()]
        return super()._compute_outputs(*args, module=module, **kwargs)

    def _forward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
        with stand_in():  # the tp plan's first-call check waits for real activations
            return super()._forward_metadata_inference(*args, **kwargs)

    def _post_metadata_inference_cleanup(self) -> None:
        super()._post_metadata_inference_cleanup()
        if self._saved_buffers is not None:
            with torch.no_grad():
                for buffer, value in zip(self.submod.buffers(), self._saved_buffers, strict=True):
                    buffer.copy_(value)
            self._saved_buffers = None


class PipelineModel(nn.Module):
    """This rank's stages of a pipeline, under the model's own parameter names.

    ``model(x, target=y)`` while training runs the schedule (forward and backward of every
    micro-batch) and returns the batch's mean loss; in evaluation ``model(x)`` returns the
    outputs. Both on every rank of the pipeline. Layers are registered under their names in
    the original model, so ``state_dict()`` and the optimizer's names match it."""

    def __init__(
        self,
        modules: list[nn.Module],
        indices: list[int],
        *,
        stages: int,
        schedule: str,
        microbatches: int,
        group: dist.ProcessGroup,
        device: torch.device,
    ) -> None:
        super().__init__()
        for module in modules:
            _graft(self, module)
        self._stage_modules = tuple(modules)  # a tuple: not registered twice
        self.stage_indices = tuple(indices)
        self.stages = stages
        self.schedule = schedule
        self.microbatches = microbatches
        self._group = group
        self._device = device
        size = dist.get_world_size(group)
        self._last = dist.get_global_rank(group, (stages - 1) % size) if size > 1 else None
        self._schedules: dict[tuple[Any, ...], Any] = {}
        self._loss_fn: LossFn | None = None
        self._accum: Callable[[], int] = lambda: 1
        self._raw: dict[int, torch.Tensor] = {}
        self._sending: Any = None  # the last stage's loss broadcast, in flight
        self._micro = microbatches

    @property
    def has_first(self) -> bool:
        return 0 in self.stage_indices

    @property
    def has_last(self) -> bool:
        return self.stages - 1 in self.stage_indices

    def use_loss(self, loss_fn: LossFn, accum: Callable[[], int]) -> None:
        """The loss of each micro-batch (``loss_fn(output, target)``, a mean over it) and the
        micro-batches per optimizer step (``grad_accum``), which divide its gradient."""
        self._loss_fn = loss_fn
        self._accum = accum

    def train(self, mode: bool = True) -> PipelineModel:
        super().train(mode)
        for module in self._stage_modules:
            module.train(mode)
        return self

    def forward(self, *args: Any, target: Any = None, **kwargs: Any) -> Any:
        training = self.training and torch.is_grad_enabled()
        if self._loss_fn is None and (training or target is not None):
            raise ConfigError(
                "The pipeline has no loss function: it computes the loss of each micro-batch "
                "on the last stage, inside the schedule. Pass it to setup: model, optimizer = "
                "run.setup(model, optimizer, loss_fn=criterion)."
            )
        if training and target is None:
            raise ConfigError(
                "A pipeline trains forward and backward together: call model(x, target=y), which "
                "returns the loss with the gradients already computed, then run.backward(loss) "
                "as usual. model(x) alone works in evaluation (model.eval() or torch.no_grad())."
            )
        batch = _batch_size(args, kwargs)
        micro = self.microbatches
        if batch % micro:
            if training:
                raise ConfigError(
                    f"A batch of {batch} samples does not split into n_microbatches={micro} "
                    "equal micro-batches. Give run.loader a batch_size that n_microbatches "
                    "divides and drop_last=True (so the last batch is full), or change "
                    "n_microbatches."
                )
            micro = 1  # evaluation: any batch size runs, as one micro-batch
        key = (training, micro, _shapes(args), _shapes(kwargs), _shapes(target))
        schedule = self._schedules.get(key)
        if schedule is None:
            schedule = self._schedules[key] = self._build(
                micro, loss=target is not None, training=training
            )
        inputs = args if self.has_first else ()
        extra = kwargs if self.has_first else {}
        goal = target if self.has_last else None
        losses: list[torch.Tensor] = []
        self._micro = micro
        try:
            if training:
                schedule.step(*inputs, target=goal, losses=losses, return_outputs=False, **extra)
            else:
                collect = losses if target is not None else None
                output = schedule.eval(*inputs, target=goal, losses=collect, **extra)
            raw = [self._raw[id(loss)] for loss in losses]
        finally:
            self._raw.clear()
        if target is not None:
            mean = torch.stack(raw).mean().float() if raw else torch.zeros((), device=self._device)
            if self._last is not None:
                self._share_loss(mean)
            loss = mean.detach().requires_grad_()
            loss._paratrain_pipeline = True  # type: ignore[attr-defined]
            return loss
        return self._from_last(output)

    def _build(self, micro: int, *, loss: bool, training: bool) -> Any:
        stages: list[Any] = [
            _Stage(module, index, self.stages, self._device, group=self._group)
            for module, index in zip(self._stage_modules, self.stage_indices, strict=True)
        ]
        options: dict[str, Any] = {
            "loss_fn": self._micro_loss if loss else None,
            "scale_grads": False,
        }
        if not training:  # forward only: any number of micro-batches, whatever the schedule
            if len(stages) > 1:
                return ScheduleLoopedBFS(stages, n_microbatches=micro, **options)
            return ScheduleGPipe(stages[0], n_microbatches=micro, **options)
        if self.schedule == "interleaved_1f1b":
            return ScheduleInterleaved1F1B(stages, n_microbatches=micro, **options)
        single = ScheduleGPipe if self.schedule == "gpipe" else Schedule1F1B
        return single(stages[0], n_microbatches=micro, **options)

    def _micro_loss(self, output: Any, target: Any) -> torch.Tensor:
        assert self._loss_fn is not None
        raw = self._loss_fn(output, target)
        # The schedule back-propagates each micro-batch's loss as it is: divide it here so the
        # summed gradients are the batch mean (and the window mean with grad_accum).
        scaled = raw / (self._micro * self._accum())
        self._raw[id(scaled)] = raw.detach()
        return scaled

    def _share_loss(self, mean: torch.Tensor) -> None:
        """The last stage's loss to every stage. The sender does not wait for it to arrive:
        its optimizer step then overlaps the first stages' last backward, as it would with no
        loss to share (waiting cost 10 % of a step at pp 2); it waits before its next send."""
        if self._sending is not None:
            self._sending.wait()
            self._sending = None
        if dist.get_rank() == self._last:
            self._sending = dist.broadcast(mean, src=self._last, group=self._group, async_op=True)
        else:
            dist.broadcast(mean, src=self._last, group=self._group)

    def _from_last(self, value: Any) -> Any:
        """``value`` as the last stage has it, on every rank of the pipeline."""
        if self._last is None:
            return value
        if isinstance(value, torch.Tensor) or value is None:
            meta = [(value.shape, value.dtype) if isinstance(value, torch.Tensor) else None]
            dist.broadcast_object_list(meta, src=self._last, group=self._group)
            if meta[0] is None:
                return None
            shape, dtype = meta[0]
            tensor = value if value is not None else torch.empty(shape, dtype=dtype)
            tensor = tensor.to(self._device).contiguous()
            dist.broadcast(tensor, src=self._last, group=self._group)
            return tensor
        box = [value]
        dist.broadcast_object_list(box, src=self._last, group=self._group)
        return box[0]


def _graft(into: nn.Module, module: nn.Module) -> None:
    """Register ``module``'s children and own tensors on ``into`` under the same names,
    merging where two stages share a container (``layers`` holding blocks of each)."""
    for name, tensor in [
        *module.named_parameters(recurse=False),
        *module.named_buffers(recurse=False),
    ]:
        if name not in into._parameters and name not in into._buffers:
            if isinstance(tensor, nn.Parameter):
                into.register_parameter(name, tensor)
            else:
                into.register_buffer(name, tensor)
    for name, child in module.named_children():
        existing = into._modules.get(name)
        if existing is None:
            into.add_module(name, child)
        elif existing is not child:
            if not isinstance(existing, _Merged):
                merged = _Merged()
                _graft(merged, existing)
                into._modules[name] = merged
            _graft(into._modules[name], child)  # type: ignore[arg-type]


class _Merged(nn.Module):
    """A container several stages share (only its names matter: it never runs)."""


def _batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    for value in [*args, *kwargs.values()]:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    raise ConfigError(
        "The pipeline got no tensor input to split into micro-batches. Call model(x, "
        "target=y) with the batch as a tensor (batch dimension first)."
    )


def _shapes(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype)
    if isinstance(value, (tuple, list)):
        return tuple(_shapes(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _shapes(v)) for k, v in sorted(value.items()))
    return None
