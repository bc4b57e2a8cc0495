"""Tensor-parallel plans on the shapes users write, at tp 2 on real gloo ranks.

A Llama-shaped language model (grouped-query attention ``wq wk wv wo`` with ``n_heads`` and
``n_kv_heads``, a gated feed-forward ``w1 w2 w3``, norms between the blocks, an embedding tied to
the output layer) trains within 1e-5 of one process under every plan style that is right: a
``pt.tp.attention`` plan, dict entries, ``ParallelStyle`` objects, the tie kept by splitting the
embedding's rows and the head's outputs (loss parallel). Every plan that cannot be right is
refused before the first optimizer step, with a message that names the layer and the fix.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import paratrain as pt
from paratrain.errors import ModelError
from tests.support.distributed import run_distributed
from tests.support.training import max_abs_diff

pytestmark = pytest.mark.dist

VOCAB, DIM, SEQ = 32, 16, 6


class Attention(nn.Module):
    """Grouped-query attention; ``infer``: the forward infers head_dim (``view(.., -1)``)."""

    def __init__(self, heads: int = 4, kv_heads: int = 2, infer: bool = False) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = heads, kv_heads, DIM // heads
        self.infer = infer
        self.wq = nn.Linear(DIM, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        dim = -1 if self.infer else self.head_dim
        q = self.wq(x).view(b, t, self.n_heads, dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, dim).transpose(1, 2)
        repeat = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """SwiGLU; ``norm``: a LayerNorm over the hidden features between the pair."""

    def __init__(self, hidden: int = 32, norm: bool = False) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, hidden, bias=False)
        self.w3 = nn.Linear(DIM, hidden, bias=False)
        self.w2 = nn.Linear(hidden, DIM, bias=False)
        self.norm = nn.LayerNorm(hidden) if norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.norm(nn.functional.silu(self.w1(x)) * self.w3(x)))


class Block(nn.Module):
    def __init__(self, **options: bool) -> None:
        super().__init__()
        self.attn_norm, self.ffn_norm = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = Attention(infer=options.get("infer", False))
        self.ffn = FeedForward(norm=options.get("norm", False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class TinyLM(nn.Module):
    def __init__(self, tied: bool = True, **options: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok_emb = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block(**options) for _ in range(2))
        self.norm = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        if tied:
            self.lm_head.weight = self.tok_emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x)).flatten(0, 1)  # (batch x time, vocab)


def tokens(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
    return TensorDataset(ids[:, :-1], ids[:, 1:].flatten(0, 0))


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, target.flatten())


ATTENTION = pt.tp.attention(
    "layers.*.attn", q="wq", k="wk", v="wv", out="wo", heads=("n_heads", "n_kv_heads")
)
FFN = {"layers.*.ffn.w1": "colwise", "layers.*.ffn.w3": "colwise", "layers.*.ffn.w2": "rowwise"}


def _objects() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {k: ColwiseParallel() if v == "colwise" else RowwiseParallel() for k, v in FFN.items()}


def _sequence_parallel() -> pt.tp.TPPlan:
    """pytorch/examples' fsdp_tp_example plan (torchtitan's): the residual stream stays split
    over the sequence, norms run on their shard, each block gathers it first; the head counts
    divided through ``heads=``, the embedding tied to the output layer split alike."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    def gathered() -> Any:
        return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))

    styles = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        "layers.*.attn_norm": SequenceParallel(),
        "layers.*.attn": gathered(),
        "layers.*.attn.wq": ColwiseParallel(),
        "layers.*.attn.wk": ColwiseParallel(),
        "layers.*.attn.wv": ColwiseParallel(),
        "layers.*.attn.wo": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.ffn": gathered(),
        "layers.*.ffn.w1": ColwiseParallel(),
        "layers.*.ffn.w3": ColwiseParallel(),
        "layers.*.ffn.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    return pt.tp.TPPlan(styles, {"layers.*.attn": ("n_heads", "n_kv_heads")})


def plans() -> dict[str, dict[str, Any]]:
    """name -> (settings of pt.Run and the model)"""
    return {
        "sequence_parallel": dict(tp_plan=_sequence_parallel()),
        "attention_and_dict": dict(tp_plan=ATTENTION | FFN),
        "style_objects": dict(tp_plan=ATTENTION | _objects()),
        "tied_split_alike": dict(
            tp_plan=ATTENTION | FFN | {"tok_emb": "rowwise"} | pt.tp.output("lm_head")
        ),
        "untied_head_output": dict(tp_plan=ATTENTION | FFN | pt.tp.output("lm_head"), tied=False),
        "auto_ffn_none": dict(tp_plan=ATTENTION | {"tok_emb": "rowwise"}, tied=False),
    }


WRONG: dict[str, dict[str, Any]] = {
    "heads_by_dict": dict(
        tp_plan={"layers.*.attn.wq": "colwise", "layers.*.attn.wk": "colwise"}
        | {"layers.*.attn.wv": "colwise", "layers.*.attn.wo": "rowwise"}
    ),
    "heads_inferred": dict(
        tp_plan={"layers.*.attn.wq": "colwise", "layers.*.attn.wk": "colwise"}
        | {"layers.*.attn.wv": "colwise", "layers.*.attn.wo": "rowwise"},
        infer=True,
    ),
    "norm_between": dict(tp_plan=ATTENTION | FFN, norm=True),
    "colwise_alone": dict(tp_plan=ATTENTION | {"layers.*.ffn.w1": "colwise"}),
    "rowwise_alone": dict(tp_plan=ATTENTION | {"layers.*.ffn.w2": "rowwise"}),
    "colwise_head": dict(tp_plan=ATTENTION | {"lm_head": "colwise"}, tied=False),
    "tie_split_one_side": dict(tp_plan=ATTENTION | pt.tp.output("lm_head")),
}


def train(steps: int = 4, tp_plan: Any = None, **options: Any) -> dict[str, Any]:
    tp = {"strategy": "tp", "tp_plan": tp_plan} if tp_plan is not None else {"strategy": "cpu"}
    with pt.Run(progress=False, seed=0, **tp) as run:
        model = TinyLM(**options)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, opt = run.setup(model, opt, loss_fn=cross_entropy)
        loader = run.loader(tokens(), batch_size=8 // run.data_size, shuffle=True)
        for x, y in loader:
            run.backward(model(x, target=y))
            run.step(opt)
            if run.global_step == steps:
                break
        inner = run.unwrap(model)
        return {
            "weights": run.strategy.full_state_dict(model),
            "tied": inner.lm_head.weight is inner.tok_emb.weight,
        }


def _refusal(settings: dict[str, Any]) -> str:
    """The ModelError's message, and the step it came at (it must come before the first)."""
    steps: list[int] = []
    try:
        with pt.Run(progress=False, seed=0, strategy="tp", tp_plan=settings["tp_plan"]) as run:
            options = {k: v for k, v in settings.items() if k != "tp_plan"}
            model = TinyLM(**options)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            model, opt = run.setup(model, opt, loss_fn=cross_entropy)
            for x, y in run.loader(tokens(), batch_size=8, shuffle=True):
                steps.append(run.global_step)
                run.backward(model(x, target=y))
                run.step(opt)
    except ModelError as err:
        return f"step {steps[-1] if steps else 'setup'}: {err}"
    return "not refused"


def _every_case() -> dict[str, Any]:
    return {
        "right": {name: train(**settings) for name, settings in plans().items()},
        "wrong": {name: _refusal(settings) for name, settings in WRONG.items()},
    }


@pytest.fixture(scope="module")
def world2() -> list[dict[str, Any]]:
    return run_distributed(_every_case, 2)


@pytest.mark.parametrize("name", list(plans()))
def test_every_plan_style_trains_as_one_process(world2: list[dict[str, Any]], name: str) -> None:
    options = {k: v for k, v in plans()[name].items() if k != "tp_plan"}
    reference = train(**options)
    got = world2[0]["right"][name]
    assert max_abs_diff(got["weights"], reference["weights"]) <= 1e-5
    assert got["tied"] == reference["tied"] == options.get("tied", True)
    assert world2[1]["right"][name]["tied"] == got["tied"]  # every rank keeps the tie


REFUSALS = {
    "heads_by_dict": ("step 0", "fails when split", "self.n_heads = 4", "tp.attention("),
    "heads_inferred": ("step 0", "computes something else", "self.n_heads = 4", "heads=()"),
    "norm_between": ("step 0", "'layers.0.ffn'", "elementwise", "leave this block out"),
    "colwise_alone": ("setup", "'layers.0.ffn.w1' colwise", "no layer in 'layers.0.ffn'"),
    "rowwise_alone": ("setup", "'layers.0.ffn.w2' rowwise", "nothing splits it"),
    "colwise_head": ("setup", "'lm_head' colwise", "no layer in the model is rowwise"),
    "tie_split_one_side": ("setup", "'lm_head.weight'", "'rowwise'", "tied"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_a_plan_that_cannot_be_right_is_refused_before_the_first_step(
    world2: list[dict[str, Any]], name: str
) -> None:
    message = world2[0]["wrong"][name]
    assert world2[1]["wrong"][name].split(":")[0] == message.split(":")[0]
    for needle in REFUSALS[name]:
        assert needle in message, message
