"""Rank guards of any spelling, helpers every rank calls, and values followed across names.

Each guarded snippet must stay clean under PT010/PT016 (a save and a print in a distributed
script); the same code without its guard must be flagged, so no case passes by not being looked
at.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.check.snippets import flagged

HEAD = """\
import os
import torch
import torch.distributed as dist
dist.init_process_group("nccl")
"""

GUARDS = {
    "equality": "if dist.get_rank() == 0:",
    "local rank in a list": "if int(os.environ['LOCAL_RANK']) in [-1, 0]:",
    "or: not distributed": "if args.local_rank == -1 or dist.get_rank() == 0:",
    "or: not initialized": "if not dist.is_initialized() or dist.get_rank() == 0:",
    "walrus": "if (rank := dist.get_rank()) == 0:",
    "variable set from a test": "is_primary = dist.get_rank() == 0\nif is_primary:",
    "attribute set from a test": "args.is_master = args.rank % 8 == 0\nif args.is_master:",
    "helper returning a test": (
        "def is_master():\n    if not dist.is_initialized():\n        return True\n"
        "    return dist.get_rank() == 0\nif is_master():"
    ),
    "library name": "if trainer.is_data_parallel_master:",
    "and with a rank test": "if epoch % 5 == 0 and dist.get_rank() == 0:",
}


def _script(guard: str) -> str:
    *setup, test = guard.split("\n")
    body = "\n".join(setup)
    return f"{HEAD}{body}\n{test}\n    torch.save(model.state_dict(), 'm.pt')\n    print(loss)\n"


@pytest.mark.parametrize("name", list(GUARDS))
def test_a_guard_of_any_spelling_keeps_saves_and_prints_on_rank_zero(name: str) -> None:
    code = _script(GUARDS[name])
    assert flagged(code, "PT010") == [] and flagged(code, "PT016") == []
    unguarded = _script(GUARDS[name]).replace(GUARDS[name].split("\n")[-1], "if True:")
    assert flagged(unguarded, "PT010") and flagged(unguarded, "PT016")


def test_match_on_the_rank_and_early_returns_are_guards() -> None:
    code = HEAD + textwrap.dedent("""
        match dist.get_rank():
            case 0:
                print("main")
            case _:
                pass
        def report(loss):
            if dist.get_rank() != 0:
                return
            print(loss)
            torch.save(loss, "loss.pt")
        report(1.0)
    """)
    assert flagged(code, "PT016") == [] and flagged(code, "PT010") == []


def test_a_helper_every_rank_calls_is_checked_and_one_called_under_a_guard_is_not() -> None:
    code = HEAD + textwrap.dedent("""
        def save(model):
            torch.save(model.state_dict(), "m.pt")
        def log(x):
            print(x)
        def train(model):
            loss = model(x).sum()
            loss.backward()
            save(model)
            if dist.get_rank() == 0:
                log(loss)
    """)
    assert flagged(code, "PT010") == [7]
    assert flagged(code, "PT016") == []


def test_prints_replaced_by_setup_for_distributed_are_not_flagged() -> None:
    code = HEAD + textwrap.dedent("""
        import builtins
        def setup_for_distributed(is_master):
            builtin_print = builtins.print
            def print(*args, **kwargs):
                if is_master or kwargs.pop("force", False):
                    builtin_print(*args, **kwargs)
            builtins.print = print
        setup_for_distributed(dist.get_rank() == 0)
        loss.backward()
        print(loss)
    """)
    assert flagged(code, "PT016") == []


def test_zero_first_barriers_are_not_a_collective_on_one_rank() -> None:
    code = HEAD + textwrap.dedent("""
        from contextlib import contextmanager
        @contextmanager
        def torch_distributed_zero_first(local_rank):
            if local_rank not in [-1, 0]:
                dist.barrier(device_ids=[local_rank])
            yield
            if local_rank == 0:
                dist.barrier(device_ids=[0])
    """)
    assert flagged(code, "PT011") == []
    assert flagged(HEAD + "if dist.get_rank() == 0:\n    dist.barrier()\n", "PT011") == [6]


def test_values_are_followed_through_names_parameters_and_returns() -> None:
    code = HEAD + textwrap.dedent("""
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DataLoader, DistributedSampler
        def make_sampler(ds):
            return DistributedSampler(ds)
        def read_rank():
            return int(os.getenv("RANK"))
        sampler = make_sampler(ds)
        loader = DataLoader(ds, batch_size=4)
        torch.cuda.set_device(read_rank())
        model = DDP(net)
        sd = model.state_dict()
        if dist.get_rank() == 0:
            torch.save(sd, "m.pt")
        def step(x):
            x.to("cuda")
        for x, y in loader:
            step(x)
    """)
    assert flagged(code, "PT003") == [12]
    assert flagged(code, "PT001") == [14]
    assert flagged(code, "PT006") == [16]
    assert flagged(code, "PT002") == [20]


@pytest.mark.parametrize(
    "guard",
    [
        "if not dist.get_rank():",
        "if self._is_rank_zero:",
        "if os.environ.get('RANK', '0') == '0':",
        "is_main = dist.get_rank() == 0 if dist.is_initialized() else True\nif is_main:",
    ],
)
def test_truth_values_private_names_strings_and_conditional_flags_are_guards(guard: str) -> None:
    code = _script(guard)
    assert flagged(code, "PT010") == [] and flagged(code, "PT016") == []


def test_what_values_returns_is_the_callers_own_list() -> None:
    """A rule that extends the list it got must not change what the next rule is told."""
    import ast

    from paratrain.commands.check.patterns import module_facts

    tree = ast.parse("def f():\n    return 1\nx = f()\ny = x\n")
    facts = module_facts(tree)
    node = tree.body[-1].value  # type: ignore[attr-defined]
    facts.values(node).append(ast.Constant(2))
    assert [ast.unparse(v) for v in facts.values(node)] == ["1"]  # type: ignore[arg-type]
    call = tree.body[1].value  # type: ignore[attr-defined]
    facts.values(call).append(ast.Constant(3))
    assert [ast.unparse(v) for v in facts.values(call)] == ["1"]  # type: ignore[arg-type]
