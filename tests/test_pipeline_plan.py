"""Cutting a model into pipeline stages (any depth, any split), the settings that cannot run,
and a pipeline in one process: each mistake is refused with its fix, before any work."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import paratrain as pt
from paratrain.errors import ConfigError, ModelError
from paratrain.plans.pipeline_stages import check_split_setting, plan_stages, spine, stage_module
from paratrain.strategies import select_strategy
from tests.support.distributed import rank_of_two


def nested(widths: list[int], groups: list[int]) -> nn.Sequential:
    """Linear layers of ``widths``, with ReLUs, grouped into nested Sequentials of ``groups``."""
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    out: list[nn.Module] = []
    position = 0
    for size in groups:
        chunk = layers[position : position + size]
        position += size
        if chunk:
            out.append(nn.Sequential(*chunk) if len(chunk) > 1 else chunk[0])
    out += layers[position:]
    return nn.Sequential(*out)


models = st.builds(
    nested,
    st.lists(st.integers(1, 5), min_size=2, max_size=7),
    st.lists(st.integers(1, 3), max_size=4),
)


@settings(max_examples=60, deadline=None)
@given(model=models, data=st.data())
def test_any_cut_keeps_every_layer_once_in_order_under_its_own_name(
    model: nn.Sequential, data: st.DataObject
) -> None:
    names = [name for name, _ in spine(model)]
    stages = data.draw(st.integers(1, len(names)))
    balanced = plan_stages(model, None, stages)
    starts = sorted(data.draw(st.sets(st.integers(1, len(names) - 1), max_size=stages - 1)))
    chosen = plan_stages(model, tuple(names[i] for i in starts), len(starts) + 1)
    x = torch.randn(3, model[0].in_features if isinstance(model[0], nn.Linear) else 1)
    for plan in (balanced, chosen):
        assert [n for stage in plan for n in stage] == names and all(plan)
        modules = [stage_module(model, stage) for stage in plan]
        keys = [k for m in modules for k in m.state_dict()]
        assert sorted(keys) == sorted(model.state_dict())  # names kept, each once
        if isinstance(model[0], nn.Linear):
            y = x
            for m in modules:
                y = m(y)
            torch.testing.assert_close(y, model(x), rtol=0, atol=0)
    assert len(balanced) == stages


def test_stages_on_one_rank_merge_under_the_models_names() -> None:
    """Two stages of one rank (interleaved) sharing a container: one module, every name once,
    the layer objects themselves."""
    from paratrain.strategies.pipeline import _graft

    model = nn.Sequential(
        nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)), nn.Linear(2, 2)
    )
    first, second = (stage_module(model, names) for names in (["0", "1.0"], ["1.2", "2"]))
    merged = nn.Module()
    _graft(merged, first)
    _graft(merged, second)
    assert sorted(merged.state_dict()) == sorted(model.state_dict())
    ours, theirs = dict(merged.named_parameters()), dict(model.named_parameters())
    assert all(ours[name] is theirs[name] for name in theirs)


def test_balanced_stages_hold_about_equal_parameters() -> None:
    model = nn.Sequential(*(nn.Linear(32, 32) for _ in range(8)))
    assert plan_stages(model, None, 4) == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    heavy = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), *(nn.Linear(8, 8) for _ in range(6)))
    assert plan_stages(heavy, None, 2)[0] == ["0"]  # the big layer alone


@pytest.mark.parametrize(
    "split,stages,needle",
    [
        (("3.1",), 2, "Did you mean '3.0'"),
        (("4", "2"), 3, "in the order the model runs them"),
        (("0",), 2, "must name layers after the first"),
        (("2",), 3, "makes 2 stages, but the pipeline runs 3"),
        (None, 9, "has 9 stages but the model has 5 layers"),
    ],
)
def test_bad_splits_name_the_layers(split: Any, stages: int, needle: str) -> None:
    model = nn.Sequential(
        nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)), nn.ReLU()
    )
    with pytest.raises(ModelError, match=needle):
        plan_stages(model, split, stages)


def test_a_model_that_is_not_sequential_needs_a_stage_builder() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

    with pytest.raises(ModelError, match="pass pipeline_split=a function"):
        spine(Net())


@pytest.mark.parametrize("value", ["layers.4", ("a", ""), (1,), nn.Linear, ("a", "a")])
def test_bad_split_settings(value: Any) -> None:
    with pytest.raises(ConfigError, match="pipeline_split"):
        check_split_setting("pipeline_split", value)


@pytest.mark.parametrize(
    "settings,needle",
    [
        (dict(mesh={"pp": 1, "dp": 2}), "the pp axis has one rank"),
        (dict(mesh={"pp": 2, "tp": 1}, precision="fp16"), "Use precision='bf16'"),
        (dict(pipeline_split=("a", "b")), "('a', 'b') makes 3 stages, which pp 2 does not"),
        (dict(pipeline_stages=4), "Use pipeline_schedule='interleaved_1f1b'"),
        (dict(pipeline_schedule="interleaved_1f1b", pipeline_stages=2), "at least 2 stages per"),
        (dict(n_microbatches=1), "1F1B needs at least as many micro-batches as stages (2)"),
        (dict(pipeline_stages=4, pipeline_split=("a",)), "Give one of them"),
        (dict(mesh={"pp": 2, "dp": 2}), "= 4 ranks, but the world size is 2"),
        (dict(strategy="fsdp", mesh={"pp": 2}), "Use strategy='pipeline'"),
        (dict(strategy="tp", mesh={"pp": 2}, tp_plan="auto"), "Use strategy='pipeline'"),
        (dict(mesh={"pp": 1, "tp": 2}), "no tp_plan says which layers of each stage to split"),
        (dict(tp_plan="auto"), "has no tp axis to split layers over"),
        (dict(strategy="ddp", n_microbatches=4), "n_microbatches is a 'pipeline' option"),
    ],
)
def test_configs_that_cannot_run_fail_before_any_rank_starts(
    settings: dict[str, Any], needle: str
) -> None:
    config = pt.RunConfig(**{"strategy": "pipeline", **settings})
    with pytest.raises(ConfigError) as err:
        select_strategy(config, rank_of_two(), gpus=0)
    assert needle in str(err.value)


def test_a_column_wise_layer_cannot_end_a_stage(tmp_path: Any) -> None:
    """At pp 1 x tp 1 nothing is split, but the plan's checks still run on the stages."""
    from paratrain.plans.tp import resolve
    from paratrain.strategies.pipeline import _check_stage_ends_whole

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    plan = {"0": "colwise", "2": "rowwise"}
    first, second = (stage_module(model, names) for names in (["0", "1"], ["2"]))
    _check_stage_ends_whole(second, resolve(second, plan, 2, part=True), 1)  # rowwise: fine
    with pytest.raises(ModelError, match="splits '0' column-wise as the last split layer"):
        _check_stage_ends_whole(first, resolve(first, plan, 2, part=True), 0)
    with pytest.raises(ModelError, match="matches no module"):
        resolve(model, {"9": "colwise"}, 2)  # the whole model is checked first
    assert resolve(first, {"9": "colwise"}, 2, part=True).styles == {}


def test_auto_picks_the_pipeline_for_a_pp_axis_or_a_pipeline_setting() -> None:
    for given_ in (dict(mesh={"pp": 2}), dict(n_microbatches=4)):
        selection = select_strategy(pt.RunConfig(**given_), rank_of_two(), gpus=0)
        assert selection.strategy.name == "pipeline" and "given" in selection.reason


# -- one process: the pipeline's own errors, and the loop every strategy runs ------------------


def _digits() -> Any:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(30, 4, generator=g), torch.arange(30) % 3)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def test_pipeline_in_one_process_refuses_what_it_cannot_run(tmp_path: Any) -> None:
    with pt.Run(strategy="pipeline", n_microbatches=4, run_dir=tmp_path, progress=False) as run:
        model = run.setup(_model())
        x, y = _digits()[:4]
        with pytest.raises(ConfigError, match=r"run.setup\(model, optimizer, loss_fn=criterion"):
            model(x, target=y)
        model.use_loss(nn.functional.cross_entropy, accum=lambda: 1)
        with pytest.raises(ConfigError, match=r"call model\(x, target=y\)"):
            model(x)
        with pytest.raises(ConfigError, match="A batch of 3 samples does not split"):
            model(x[:3], target=y[:3])
        with pytest.raises(ConfigError, match="batch_size of 5 samples per rank"):
            run.loader(_digits(), batch_size=5)
        with pytest.raises(ConfigError, match=r"last batch of 2 samples.*drop_last=True"):
            run.loader(_digits(), batch_size=4)  # 30 = 7 x 4 + 2
        run.loader(_digits(), batch_size=4, drop_last=True)
        with pytest.raises(ConfigError, match="put the weighting or the extra term into loss_fn"):
            run.backward(model(x, target=y) * 2)  # the schedule has back-propagated already
        model.eval()
        with torch.no_grad():
            assert model(x[:3]).shape == (3, 3)  # evaluation takes any batch


@pytest.mark.parametrize("strategy", ["cpu", "pipeline"])
def test_the_same_loop_trains_under_any_strategy(strategy: str, tmp_path: Any) -> None:
    with pt.Run(strategy=strategy, run_dir=tmp_path, progress=False, grad_accum=2) as run:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        model, opt = run.setup(model, opt, loss_fn=nn.functional.cross_entropy)
        loader = run.loader(_digits(), batch_size=2, drop_last=True)
        first = None
        for _ in run.epochs(3):
            for x, y in loader:
                with run.accumulate(model):
                    loss = model(x, target=y)
                    run.backward(loss)
                run.step(opt)
                first = float(loss.detach()) if first is None else first
        model.eval()
        x, y = _digits()[:]
        with torch.no_grad():
            plain = nn.functional.cross_entropy(model(x), y)
            assert float(model(x, target=y)) == pytest.approx(float(plain), abs=1e-6)
        assert float(plain) < first


def test_a_loss_fn_that_is_not_a_function_is_refused_before_the_model_is_set_up(
    tmp_path: Any,
) -> None:
    with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False) as run:
        model = _model()
        with pytest.raises(ModelError, match="must be a function \\(output, target\\) -> loss"):
            run.setup(model, loss_fn="cross_entropy")
        model = run.setup(model, loss_fn=nn.functional.cross_entropy)  # nothing was lost
        x, y = _digits()[:4]
        torch.testing.assert_close(model(x, target=y), nn.functional.cross_entropy(model(x), y))


class _TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_emb: nn.Module | None = nn.Embedding(10, 4)
        self.body = nn.Linear(4, 4)
        self.lm_head: nn.Module | None = nn.Linear(4, 10, bias=False)
        assert self.tok_emb is not None and self.lm_head is not None
        self.lm_head.weight = self.tok_emb.weight


def _cut_tied(model: nn.Module, stage: int, stages: int) -> nn.Module:
    import copy

    part = copy.deepcopy(model)
    if stage == 0:
        part.lm_head = None
    else:
        part.tok_emb = None
    return part


def test_a_stage_builder_that_splits_tied_weights_is_told_they_are_tied() -> None:
    from paratrain.plans.pipeline_stages import built_stage

    model = _TiedLM()
    with pytest.raises(ModelError, match=r"'tok_emb\.weight' and 'lm_head\.weight' are one tied"):
        built_stage(_cut_tied, model, 0, 2)
    with pytest.raises(ModelError, match=r"'lm_head\.weight' and 'tok_emb\.weight' are one tied"):
        built_stage(_cut_tied, model, 1, 2)
    assert built_stage(lambda m, stage, stages: m, model, 0, 1) is model  # both in one stage
