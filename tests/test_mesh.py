"""Mesh arithmetic and tensor-parallel plans: every bad layout fails before training, with the
arithmetic or the module names that fix it."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import paratrain as pt
from paratrain.errors import ConfigError, ModelError
from paratrain.plans.mesh import AXES, MeshShape, check_mesh_setting
from paratrain.plans.tp import TPPlan, attention, auto_plan, mlp, output, resolve
from tests.support.distributed import rank_of_two

sizes = st.dictionaries(st.sampled_from(AXES), st.integers(1, 6), min_size=1)


@given(mesh=sizes, world=st.integers(1, 64))
def test_a_mesh_fits_only_its_world_size(mesh: dict[str, int], world: int) -> None:
    product = math.prod(mesh.values())
    if product != world:
        with pytest.raises(ConfigError) as err:
            MeshShape.resolve(mesh, world)
        assert f"= {product} ranks, but the world size is {world}" in str(err.value)
        return
    shape = MeshShape.resolve(mesh, world)
    assert shape.world_size == world
    assert {a: s for a, s in shape.sizes.items() if a in mesh} == mesh
    assert shape.data_size * shape.copies == world
    # ranks of one tp group (neighbours) and of one pipeline (pp apart) share a data rank; data
    # ranks cover 0..data_size-1
    ranks = [shape.data_rank(r) for r in range(world)]
    assert sorted(set(ranks)) == list(range(shape.data_size))
    assert all(ranks.count(d) == shape.copies for d in set(ranks))
    tp, stride = shape.sizes["tp"], world // shape.sizes["pp"]
    assert all(ranks[r] == ranks[r - r % tp] == ranks[r % stride] for r in range(world))


@given(mesh=sizes, free=st.sampled_from(AXES), world=st.integers(1, 64))
def test_minus_one_takes_what_the_world_size_leaves(
    mesh: dict[str, int], free: str, world: int
) -> None:
    mesh = {**mesh, free: -1}
    known = math.prod(v for v in mesh.values() if v != -1)
    if world % known:
        with pytest.raises(ConfigError, match=f"does not divide world size {world}"):
            MeshShape.resolve(mesh, world)
        return
    assert MeshShape.resolve(mesh, world).sizes[free] == world // known


@pytest.mark.parametrize(
    "value,needle",
    [
        ({"cp": 2}, "unknown axis 'cp'"),
        ({"dp_shard": 2}, "unknown axis 'dp_shard'"),
        ({"dp": 0}, "must be a whole number >= 1, or -1"),
        ({"tp": -2}, "must be a whole number >= 1, or -1"),
        ({"tp": True}, "must be a whole number"),
        ({"tp": 2.0}, "must be a whole number"),
        ({"dp": -1, "tp": -1}, "more than one -1"),
        ({}, "must be None or a dict"),
        ([("dp", 2)], "must be None or a dict"),
        ("dp=2", "must be None or a dict"),
    ],
)
def test_bad_mesh_settings_name_the_fix(value: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        check_mesh_setting("mesh", value)
    with pytest.raises(ConfigError, match=needle):
        pt.Run(mesh=value, progress=False)
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "settings,needle",
    [
        (dict(mesh={"dp": 2, "tp": 2}), r"dp 2 x tp 2 = 4 ranks, but the world size is 1"),
        (dict(strategy="tp", mesh={"dp": 3}, tp_plan="auto"), "= 3 ranks"),
        (dict(strategy="ddp", mesh={"dp": 1}), "mesh is a 'fsdp', 'tp' or 'pipeline' option"),
        (dict(strategy="cpu", tp_plan="auto"), "tp_plan is a 'tp' or 'pipeline' option"),
        (dict(strategy="tp"), "strategy 'tp' needs tp_plan"),
        (dict(strategy="tp", tp_plan={"fc": "diagonal"}), "Styles: colwise, rowwise, sequence"),
        (dict(strategy="tp", tp_plan={}), "tp_plan must be 'auto'"),
        (dict(strategy="tp", tp_plan=["fc1"]), "tp_plan must be 'auto'"),
        (dict(strategy="tp", tp_plan={1: "colwise"}), "keys must be module names"),
    ],
)
def test_impossible_layouts_fail_before_a_process_group(
    settings: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        pt.Run(progress=False, **settings)
    assert not dist.is_initialized()


def test_fsdp_refuses_a_tp_axis() -> None:
    from paratrain.strategies.fsdp import FSDPStrategy

    two = rank_of_two()
    with pytest.raises(ConfigError, match="has a tp axis, which strategy 'fsdp' does not split"):
        FSDPStrategy.mesh_shape(pt.RunConfig(mesh={"tp": 2}), two)


class Attention(nn.Module):
    def __init__(self, heads: int = 4) -> None:
        super().__init__()
        self.n_heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(8, 8) for _ in range(4))


class Model(nn.Module):
    def __init__(self, heads: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                {
                    "attn": Attention(heads),
                    "mlp": nn.Sequential(
                        nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 8)
                    ),
                }
            )
            for _ in range(2)
        )
        self.norm = nn.LayerNorm(8)


PLAN = attention("layers.*.attn") | mlp("layers.*.mlp", up="0", down="3")


def test_a_plan_expands_patterns_to_every_matching_layer() -> None:
    plan = resolve(Model(), PLAN, 2)
    assert sorted(plan.styles) == sorted(
        f"layers.{i}.{name}"
        for i in range(2)
        for name in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.0", "mlp.3")
    )
    kinds = {n: type(s).__name__ for n, s in plan.styles.items()}
    assert kinds["layers.1.attn.o_proj"] == "RowwiseParallel"
    assert kinds["layers.0.mlp.0"] == "ColwiseParallel"
    assert [(name, attr) for _, name, attr in plan.heads] == [
        ("layers.0.attn", "n_heads"),
        ("layers.1.attn", "n_heads"),
    ]


@pytest.mark.parametrize(
    "plan,heads,tp,needle",
    [
        ({"layers.*.mlp.fc1": "colwise"}, 4, 2, "matches no module of Model"),
        ({"layers.*.attn.q_prj": "colwise"}, 4, 2, r"Did you mean 'layers.\*.attn.q_proj'"),
        ({"norm": "colwise"}, 4, 2, "split nn.Linear and nn.Embedding layers"),
        ({"layers.*.mlp": "rowwise"}, 4, 2, r"Name the Linear inside it \('layers.0.mlp.0'\)"),
        ({"layers.0.mlp.0": "colwise"}, 4, 3, r"its out_features \(32\) over tp 3"),
        (attention("layers.*.attn"), 3, 2, "3 heads, not a multiple of tp 2"),
        (attention("layers.*.attn", heads=("num_heads",)), 4, 2, "has none of them"),
        (output("norm"), 4, 2, "must be the nn.Linear that produces the logits"),
        (output("layers.0.mlp.3"), 4, 3, r"its out_features \(8\) over tp 3"),
    ],
)
def test_a_plan_that_does_not_fit_the_model_names_the_fix(
    plan: object, heads: int, tp: int, needle: str
) -> None:
    with pytest.raises(ModelError, match=needle):
        resolve(Model(heads), plan, tp)


def test_an_output_layer_keeps_its_logits_split_for_a_parallel_loss() -> None:
    plan = resolve(Model(), PLAN | output("layers.1.mlp.3"), 2)
    style = plan.styles["layers.1.mlp.3"]
    assert plan.loss_parallel and not resolve(Model(), PLAN, 2).loss_parallel
    assert type(style).__name__ == "ColwiseParallel" and style.use_local_output is False
    assert [p.dim for p in style.output_layouts] == [-1]


def test_auto_splits_only_forwards_it_knows() -> None:
    model = nn.Sequential(
        nn.Linear(4, 8),
        nn.ReLU(),
        nn.Linear(8, 8),
        nn.LayerNorm(8),  # not elementwise over features: no pair across it
        nn.Linear(8, 16),
        nn.Linear(16, 4),
        nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, batch_first=True),
    )
    styles = auto_plan(model).styles
    assert styles == {
        "0": "colwise",
        "2": "rowwise",
        "4": "colwise",
        "5": "rowwise",
        "6.linear1": "colwise",
        "6.linear2": "rowwise",
    }
    with pytest.raises(ModelError, match="found nothing it can split"):
        resolve(Attention(), "auto", 2)


def test_plans_join_but_never_give_one_layer_two_styles() -> None:
    joined = mlp("a") | {"b": "sequence"}
    assert joined.styles == {"a.fc1": "colwise", "a.fc2": "rowwise", "b": "sequence"}
    with pytest.raises(ConfigError, match=r"Both plans set a style for 'a\.fc1'"):
        mlp("a") | TPPlan({"a.fc1": "rowwise"})


def test_one_process_tp_run_trains_and_says_what_it_split(
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    with pt.Run(strategy="tp", tp_plan="auto", progress=False) as run:
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        first = nn.functional.cross_entropy(model(x), y)
        for _ in range(5):
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(opt)
        assert float(nn.functional.cross_entropy(model(x), y)) < float(first)
        assert (run.data_rank, run.data_size) == (0, 1)
    out = capsys.readouterr().out
    assert "tensor parallel over tp 1: 0 ColwiseParallel, 2 RowwiseParallel" in out
    with (
        pt.Run(strategy="tp", tp_plan={"1": "colwise"}, progress=False) as run,
        pytest.raises(ModelError, match="GELU"),
    ):
        run.setup(nn.Sequential(nn.Linear(4, 8), nn.GELU()))


class _Locked(nn.Module):
    """A block holding a lock (deepcopy cannot copy one): its first call is not compared."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.lock = threading.Lock()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.lock:
            return self.fc2(torch.relu(self.fc1(x)))


def test_a_block_that_cannot_be_copied_trains_and_says_it_was_not_compared(
    capsys: pytest.CaptureFixture[str],
) -> None:
    net = nn.Sequential(_Locked())
    with pt.Run(strategy="tp", tp_plan={"0.fc1": "colwise", "0.fc2": "rowwise"}) as run:
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        run.backward(model(torch.randn(8, 4)).square().mean())
        assert run.step(opt)
    assert "'0' is not compared with its unsplit copy on its first call" in capsys.readouterr().out


def test_pairs_follow_the_layouts_a_style_object_declares() -> None:
    """torchtitan's shape: wo hands on a sequence shard, the norm is sequence parallel, the
    output layer gathers its logits; none of that is a colwise layer without its partner."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    from paratrain.plans.tp_split import check_pairs

    model = nn.Module()
    model.attention = nn.Module()
    for name in ("wq", "wk", "wv", "wo"):
        model.attention.add_module(name, nn.Linear(8, 8))
    model.attention_norm, model.output = nn.LayerNorm(8), nn.Linear(8, 16)
    plan: dict[str, Any] = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "attention_norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    check_pairs(model, plan)
    with pytest.raises(ModelError, match=r"'attention\.wq' colwise, but no layer in 'attention'"):
        check_pairs(model, {k: v for k, v in plan.items() if k != "attention.wo"})
    with pytest.raises(ModelError, match=r"'output' colwise, but no layer in the model"):
        check_pairs(model, {**plan, "output": ColwiseParallel()})


names = st.sampled_from(
    [
        "layers.0.mlp.0",
        "layers.*.mlp.3",
        "layers.*.attn.*_proj",
        "norm",
        "layers",
        "*",
        "",
        "..",
        "layers.9.mlp.0",
        "layers.0.attn",
        "layers.[01].mlp.0",
        "x" * 300,
    ]
) | st.text(max_size=20)
styles = (
    st.sampled_from(["colwise", "rowwise", "sequence", "Colwise", "", "diagonal"]) | st.integers()
)


@settings(deadline=None)  # the first plan imports DTensor
@given(plan=st.dictionaries(names, styles, max_size=5), tp=st.integers(1, 5))
def test_any_plan_is_applied_or_refused_with_a_message(plan: dict[Any, Any], tp: int) -> None:
    try:
        check_tp_plan_and_resolve(plan, tp)
    except (ConfigError, ModelError) as err:
        assert str(err).endswith((".", ")", "?")) and len(str(err)) > 40


def check_tp_plan_and_resolve(plan: dict[Any, Any], tp: int) -> None:
    from paratrain.plans.tp import check_tp_plan

    check_tp_plan("tp_plan", plan)
    resolve(Model(), plan, tp)
