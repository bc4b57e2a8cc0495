"""The loop core does what the script's own torch loop would: a save changes nothing, the step
count follows its stated rule, clipping sums the norm in the script's order, ``run.print`` takes
print's keywords. Each case is compared with plain torch, bit for bit."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

import paratrain as pt

X = torch.randn(16, 6, generator=torch.Generator().manual_seed(1))
Y = torch.randn(16, 3, generator=torch.Generator().manual_seed(2))


def net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3))


def loss_of(model: nn.Module) -> torch.Tensor:
    return nn.functional.mse_loss(model(X), Y)


def same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_a_save_before_the_first_step_creates_no_optimizer_state(tmp_path: Path) -> None:
    plain = net()
    opt = torch.optim.Adam(plain.parameters(), lr=0.1)
    for _ in range(3):
        loss_of(plain).backward()
        opt.step()
        opt.zero_grad()
    with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False) as run:
        model = net()
        model, adam = run.setup(model, torch.optim.Adam(model.parameters(), lr=0.1))
        run.save()
        assert not adam.state, "the save gave the optimizer a state"
        assert all(p.grad is None for p in model.parameters())
        for _ in range(3):
            run.backward(loss_of(model))
            run.step(adam)
        assert same(model, plain)
        assert [float(s["step"]) for s in adam.state.values()] == [3.0] * 6


def test_an_optimizer_saved_without_state_resumes_without_state(tmp_path: Path) -> None:
    """Model a trained, model b not yet: b's Adam resumes with no state, a's with its own."""
    with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False) as run:
        a, b = net(0), net(1)
        a, opt_a = run.setup(a, torch.optim.Adam(a.parameters(), lr=0.1), name="a")
        b, opt_b = run.setup(b, torch.optim.Adam(b.parameters(), lr=0.1), name="b")
        run.backward(loss_of(a))
        run.step(opt_a)
        run.save()
        expected = copy.deepcopy(b)
    with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False) as run:
        a, b = net(5), net(6)
        a, opt_a = run.setup(a, torch.optim.Adam(a.parameters(), lr=0.1), name="a")
        b, opt_b = run.setup(b, torch.optim.Adam(b.parameters(), lr=0.1), name="b")
        run.resume()
        assert not opt_b.state and len(opt_a.state) == 6
        assert same(b, expected)


@pytest.mark.parametrize(
    "pattern,expected",
    [
        ("a" * 5 + "b" * 5, 10),  # sequential models
        ("ab" * 5, 5),  # a GAN's D and G, one round per iteration
        ("abab" + "b" * 3, 5),  # b goes on alone: each of its steps is a round
        ("aaab" * 3, 10),  # a critic 3x per generator step: 3 per round, 4 for the first
        ("a" * 4, 4),
    ],
)
def test_global_step_follows_the_stated_rule(pattern: str, expected: int, tmp_path: Path) -> None:
    with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False) as run:
        models = {}
        for key, seed in (("a", 0), ("b", 1)):
            m = net(seed)
            models[key] = run.setup(m, torch.optim.SGD(m.parameters(), lr=0.01), name=key)
        for key in pattern:
            model, opt = models[key]
            run.backward(loss_of(model))
            run.step(opt)
        assert run.global_step == expected


def test_two_optimizers_of_one_model_count_once_per_round(tmp_path: Path) -> None:
    with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False) as run:
        m = net()
        first, last = list(m.parameters())[:2], list(m.parameters())[2:]
        model, o1, o2 = run.setup(
            m, torch.optim.SGD(first, lr=0.01), torch.optim.Adam(last, lr=0.01)
        )
        for _ in range(4):
            run.backward(loss_of(model))
            run.step(o1)
            run.step(o2)
        assert run.global_step == 4


def test_the_round_state_is_saved_with_the_loop(tmp_path: Path) -> None:
    """Resumed in the middle of b's rounds, the count goes on as it would have."""

    def train(pattern: str, resume: bool) -> int:
        with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False) as run:
            models = {}
            for key, seed in (("a", 0), ("b", 1)):
                m = net(seed)
                models[key] = run.setup(m, torch.optim.SGD(m.parameters(), lr=0.01), name=key)
            if resume:
                run.resume()
            for key in pattern:
                model, opt = models[key]
                run.backward(loss_of(model))
                run.step(opt)
            run.save()
            return run.global_step

    assert train("ab", resume=False) == 1
    assert train("ab" * 2, resume=True) == 3


def test_max_grad_norm_is_bit_identical_to_clipping_the_model_parameters(
    tmp_path: Path,
) -> None:
    """Decay and no-decay groups (minGPT's) list the parameters in another order than the
    model: the norm must be summed in the model's order, as the script's own call does."""

    def groups(model: nn.Module) -> list[dict[str, object]]:
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        decay = [p for p in model.parameters() if p.dim() >= 2]
        return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay}]

    torch.manual_seed(0)
    base = nn.Sequential(
        nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 32), nn.LayerNorm(32), nn.Linear(32, 4)
    )
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    plain = copy.deepcopy(base)
    opt = torch.optim.AdamW(groups(plain), lr=1e-3, weight_decay=0.1)
    for _ in range(20):
        nn.functional.mse_loss(plain(x), y).backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.05)
        opt.step()
        opt.zero_grad()
    with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False, max_grad_norm=0.05) as run:
        mine = copy.deepcopy(base)
        model, adamw = run.setup(mine, torch.optim.AdamW(groups(mine), lr=1e-3, weight_decay=0.1))
        for _ in range(20):
            run.backward(nn.functional.mse_loss(model(x), y))
            run.step(adamw)
    assert same(mine, plain)


def test_run_print_takes_prints_keywords(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False) as run:
        run.print("a", "b", sep="-", end="!\n", flush=True)
    assert "a-b!\n" in capsys.readouterr().out


def _clip_parity(shape: str, run_dir: Path) -> bool:
    """One of three shapes, plain torch against pt.Run(max_grad_norm=0.05), bit for bit."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    x, y = torch.randn(8, 4), torch.randn(8, 2) * 10
    models = [copy.deepcopy(base), copy.deepcopy(base)]
    if shape == "param group added later":
        for m in models:
            m[0].requires_grad_(False)
    for ours, model in enumerate(models):
        run = (
            pt.Run(strategy="cpu", run_dir=run_dir, progress=False, max_grad_norm=0.05)
            if ours
            else None
        )
        first, second = (torch.optim.SGD(model[i].parameters(), lr=0.1) for i in (0, 1))
        # "head only": the body gets gradients but no optimizer holds it; "two optimizers":
        # the first one steps every other iteration
        opts = [first, second] if shape.startswith("two") else [second]
        net = model
        if run is not None:
            net, *opts = run.setup(model, *opts)
        for s in range(4):
            if shape == "param group added later" and s == 2:
                model[0].requires_grad_(True)
                opts[0].add_param_group({"params": list(model[0].parameters()), "lr": 0.05})
            loss = nn.functional.mse_loss(net(x), y)
            if run is None:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            else:
                run.backward(loss)
            for k, opt in enumerate(opts):
                if len(opts) == 2 and k == 0 and s % 2:
                    continue  # not this iteration: its gradients wait
                if run is None:
                    opt.step()
                    opt.zero_grad()
                else:
                    run.step(opt)
            if len(opts) == 1:
                model.zero_grad()
        if run is not None:
            run.close()
    return same(*models)


@pytest.mark.parametrize(
    "shape", ["head only", "param group added later", "two optimizers, one skipping"]
)
def test_max_grad_norm_matches_clipping_every_model_parameter(shape: str, tmp_path: Path) -> None:
    assert _clip_parity(shape, tmp_path)
