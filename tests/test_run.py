import json
import logging

import pytest
import torch
from torch import nn

import paratrain as pt
from paratrain.errors import ConfigError, ModelError
from tests.support.training import dataset, mlp


@pytest.mark.parametrize(
    "settings,needle",
    [
        (dict(grad_accum=0), "grad_accum must be a positive integer"),
        (dict(grad_accum=-2), "grad_accum must be a positive integer"),
        (dict(precision="fp8"), "Available: fp32, bf16, fp16"),
        (dict(max_grad_norm=0), "max_grad_norm must be None or a number above 0"),
    ],
)
def test_bad_settings(settings: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        pt.Run(**settings)


def test_model_without_parameters_is_refused() -> None:
    with pt.Run(strategy="cpu") as run, pytest.raises(ModelError, match="no trainable parameters"):
        run.setup(nn.Sequential(nn.ReLU(), nn.Dropout()))


def test_wrapped_model_is_refused() -> None:
    with pt.Run(strategy="cpu") as run:
        model = run.setup(mlp())
        with pytest.raises(ModelError, match="already given to"):
            run.setup(model)


def test_step_without_accumulate_block_when_accumulating() -> None:
    with pt.Run(strategy="cpu", grad_accum=2) as run:
        with pytest.raises(ModelError, match="not in the model"):
            run.setup(mlp(), torch.optim.SGD(mlp().parameters(), lr=0.1))
        model = mlp()
        model, opt = run.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        x, y = dataset(4)[:]
        run.backward(nn.functional.cross_entropy(model(x), y))
        with pytest.raises(ConfigError, match=r"run\.accumulate"):
            run.step(opt)


def test_loader_refuses_a_sampler_and_bad_batch_size() -> None:
    with pt.Run(strategy="cpu") as run:
        with pytest.raises(ConfigError, match="chooses the sampler"):
            run.loader(dataset(), batch_size=4, sampler=[0, 1])
        with pytest.raises(ConfigError, match="per-rank"):
            run.loader(dataset(), batch_size=0)


def test_precision_bf16_runs_the_forward_in_bf16_and_returns_fp32() -> None:
    with pt.Run(strategy="cpu", precision="bf16") as run:
        model = run.setup(mlp())
        inner: list[torch.dtype] = []
        model[0].register_forward_hook(lambda m, a, out: inner.append(out.dtype))
        x = torch.randn(2, 6)
        out = model(x)
        assert inner == [torch.bfloat16]  # computed in bf16
        assert out.dtype == torch.float32  # handed back in fp32, so the loss runs in fp32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(out, mlp_copy(model)(x).float())
        assert run.unwrap(model).state_dict().keys() == mlp().state_dict().keys()


def mlp_copy(model: torch.nn.Module) -> torch.nn.Module:
    plain = mlp()
    plain.load_state_dict(model.state_dict())
    return plain


def test_fp16_exposes_its_scaler_and_steps() -> None:
    with pt.Run(strategy="cpu", precision="fp16") as run:
        model = mlp()
        model, opt = run.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        assert run.precision.scaler is not None
        x, y = dataset(8)[:]
        before = [p.detach().clone() for p in model.parameters()]
        stepped = []
        for _ in range(20):  # the first steps may overflow at the initial scale and be skipped
            run.backward(nn.functional.cross_entropy(model(x), y))
            stepped.append(run.step(opt))
        assert any(stepped) and run.global_step == sum(stepped)
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        assert run.precision.scaler.get_scale() < 65536.0 or all(stepped)


def test_activation_checkpointing_keeps_keys_and_gradients() -> None:
    x, y = dataset(8)[:]
    grads = []
    for policy in ((), (nn.Linear,)):
        with pt.Run(strategy="cpu", activation_checkpointing=policy) as run:
            model = run.setup(mlp())
            nn.functional.cross_entropy(model(x), y).backward()
            grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.allclose(grads[0][k], grads[1][k]) for k in grads[0])


def test_log_writes_metrics_and_tensorboard(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    with pt.Run(strategy="cpu", run_dir=tmp_path, tensorboard=True) as run:
        run.log({"loss": 0.5}, step=3)
        run.print("hello from the main process")
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record["loss"] == 0.5 and record["step"] == 3
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    out = capsys.readouterr().out
    assert "hello from the main process" in out and "strategy cpu" in out


def test_save_weights_are_unprefixed_and_atomic(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pt.Run(strategy="cpu") as run:
        model = run.setup(mlp())
        path = run.save_weights(model, tmp_path / "w.pt")
    state = torch.load(path, weights_only=True)
    assert state.keys() == mlp().state_dict().keys()
    assert [p.name for p in tmp_path.iterdir()] == ["w.pt"]


class _Tied(nn.Module):
    """A language model's shape: the output layer shares the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(300, 64)
        self.head = nn.Linear(64, 300, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(x))


def test_save_weights_keeps_tied_weights_tied(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pt.Run(strategy="cpu") as run:
        model = run.setup(_Tied())
        path = run.save_weights(model, tmp_path / "w.pt")
        torch.save(run.unwrap(model).state_dict(), tmp_path / "plain.pt")
    state = torch.load(path, weights_only=True)
    assert state["emb.weight"].data_ptr() == state["head.weight"].data_ptr()
    assert path.stat().st_size == pytest.approx((tmp_path / "plain.pt").stat().st_size, rel=0.01)
    fresh = _Tied()
    fresh.load_state_dict(state)
    assert fresh.head.weight is fresh.emb.weight


def test_accumulate_takes_a_compiled_set_up_model() -> None:
    with pt.Run(strategy="cpu", grad_accum=2, progress=False) as run:
        net = mlp()
        model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        compiled = torch.compile(model, backend="eager")
        before = [p.detach().clone() for p in model.parameters()]
        x, y = dataset().tensors
        for _ in range(2):
            with run.accumulate(compiled):
                run.backward(nn.functional.cross_entropy(compiled(x), y))
            run.step(optimizer)
        assert run.global_step == 1
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_logger_is_silent_off_the_main_process() -> None:
    from paratrain.runtime.console import Console

    off = Console(is_main=False, run_dir=".", progress=False)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "msg", None, None)
    assert not off.logger("tests.off_main").filter(record)
    on = Console(is_main=True, run_dir=".", progress=False)
    assert on.logger("tests.on_main").filter(record)


def test_process_group_is_torn_down_when_user_code_raises() -> None:
    import torch.distributed as dist

    with pytest.raises(RuntimeError, match="user bug"), pt.Run(strategy="ddp") as run:
        assert dist.is_initialized() and run.world_size == 1
        raise RuntimeError("user bug")
    assert not dist.is_initialized()
    with pt.Run(strategy="ddp") as run:  # and a new run can start afterwards
        assert run.reduce(2.0, "sum") == 2.0


def test_run_json_records_the_resolved_settings_and_extra(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pt.Run(strategy="cpu", run_dir=tmp_path, extra={"lr": 0.1, "note": "baseline"}):
        pass
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["settings"]["extra"] == {"lr": 0.1, "note": "baseline"}
    assert record["strategy"] == "cpu" and record["world_size"] == 1
    assert record["settings"]["run_dir"] == str(tmp_path) and record["torch"] == torch.__version__


class _Odd(nn.Module):
    """State a plain state_dict keeps and a saved file must keep too."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        z = torch.tensor([1 + 2j, 3 - 4j])
        self.register_buffer("z", z)
        self.register_buffer("zc", z.conj())  # a conjugate view of the same memory
        self.register_buffer("sparse", torch.eye(3).to_sparse())
        self.note = {"version": 3}

    def get_extra_state(self) -> dict[str, int]:
        return self.note

    def set_extra_state(self, state: dict[str, int]) -> None:
        self.note = state


def test_save_weights_keeps_views_sparse_buffers_and_extra_state(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pt.Run(strategy="cpu") as run:
        model = run.setup(_Odd())
        path = run.save_weights(model, tmp_path / "w.pt")
        expected = run.unwrap(model).state_dict()
    state = torch.load(path, weights_only=True)
    assert state.keys() == expected.keys()
    assert torch.equal(state["zc"], expected["zc"]) and not torch.equal(state["zc"], state["z"])
    assert torch.equal(state["sparse"].to_dense(), torch.eye(3))
    assert state["_extra_state"] == {"version": 3}
    _Odd().load_state_dict(state, strict=True)


def test_cpu_copies_ties_what_the_model_ties_even_when_the_state_has_copies() -> None:
    from paratrain.strategies.base import cpu_copies

    model = _Tied()
    state = {k: v.clone() for k, v in model.state_dict().items()}  # as FSDP hands them back
    copies = cpu_copies(state, model)
    assert copies["emb.weight"] is copies["head.weight"]
    state["head.weight"] += 1  # not equal any more: never tied by force
    copies = cpu_copies(state, model)
    assert copies["emb.weight"] is not copies["head.weight"]


def test_run_json_takes_any_extra_and_follows_grad_accum(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cycle: dict[str, object] = {}
    cycle["self"] = cycle
    extra = {"weights": {(0, 1): 0.5}, "nan": float("nan"), "cycle": cycle, "t": torch.ones(2)}
    with pt.Run(strategy="cpu", run_dir=tmp_path, extra=extra, global_batch=32) as run:
        record = json.loads((tmp_path / "run.json").read_text())
        assert record["settings"]["grad_accum"] == 1
        run.loader(dataset(64), batch_size=8)  # grad_accum = 32 / 8 = 4
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["settings"]["grad_accum"] == 4
    saved = record["settings"]["extra"]
    assert saved["weights"] == {"(0, 1)": 0.5} and saved["nan"] == "nan"
    assert "tensor" in saved["t"]
