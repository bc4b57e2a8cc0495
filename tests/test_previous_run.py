"""A run dir that holds another run's checkpoints: refused, resumed or set aside, never mixed.

Each ``pt.Run`` in one process is a new job with an id of its own (``job-<hex>``), as two
``python train.py`` invocations are.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import paratrain as pt
from paratrain.commands.run.plan import RunOptions, make_plan
from paratrain.errors import ConfigError


def _train(run_dir: Path, *, steps: int, resume: bool = False, **settings: object) -> pt.Run:
    run = pt.Run(run_dir=run_dir, progress=False, stats_every=None, **settings)
    net = torch.nn.Linear(4, 2)
    model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    if resume:
        run.resume()
    for _ in range(steps):
        with run.accumulate(model):  # a resume by itself comes here, before the forward
            run.backward(model(torch.ones(8, 4)).sum())
        run.step(opt)
        run.save()
    run.close()
    return run


def _saved(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))


def test_a_run_that_did_not_resume_is_refused_and_nothing_is_lost(tmp_path: Path) -> None:
    first = _train(tmp_path, steps=2)
    before = _saved(tmp_path)
    with pytest.raises(ConfigError) as err:
        _train(tmp_path, steps=2)
    text = str(err.value)
    assert f"of run {first._checkpoints.identity.run_id} (newest at step 2)" in text
    assert "this run (job-" in text and "paratrain run --resume" in text and "--fresh" in text
    assert _saved(tmp_path) == before  # refused before its first step: nothing written


def test_resume_called_or_asked_for_continues_the_other_run(tmp_path: Path) -> None:
    _train(tmp_path, steps=2)
    assert _train(tmp_path, steps=1, resume=True).global_step == 3
    assert _train(tmp_path, steps=1, previous_run="resume").global_step == 4


def test_fresh_moves_the_other_runs_checkpoints_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _train(tmp_path, steps=2)
    old = first._checkpoints.identity.run_id
    monkeypatch.setenv("PARATRAIN_PREVIOUS_RUN", "fresh")  # what `paratrain run --fresh` sets
    second = _train(tmp_path, steps=1)
    assert second.global_step == 1 and _saved(tmp_path) == ["step-00000001"]
    aside = tmp_path / f"checkpoints.{old}"
    assert sorted(p.name for p in aside.glob("step-*")) == ["step-00000001", "step-00000002"]


def test_an_empty_or_own_folder_is_not_refused(tmp_path: Path) -> None:
    run = pt.Run(run_dir=tmp_path, progress=False, stats_every=None)
    net = torch.nn.Linear(4, 2)
    model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    for _ in range(3):  # its own saves between steps are its own lineage
        run.backward(model(torch.ones(8, 4)).sum())
        run.step(opt)
        run.save()
    run.close()
    assert len(_saved(tmp_path)) == 3


def test_share_writes_beside_the_other_run_on_purpose(tmp_path: Path) -> None:
    _train(tmp_path, steps=2)
    assert _train(tmp_path, steps=3, previous_run="share").global_step == 3
    assert _saved(tmp_path) == [  # the second run's saves at steps 1 and 2 sit beside the first's
        "step-00000001",
        "step-00000001.1",
        "step-00000002",
        "step-00000002.1",
        "step-00000003",
    ]


def test_bad_values_are_named() -> None:
    with pytest.raises(ConfigError, match="previous_run"):
        pt.RunConfig(previous_run="keep")
    with pytest.raises(ConfigError, match="PARATRAIN_PREVIOUS_RUN='keep'"):
        from paratrain.distributed.environment import LaunchEnv

        LaunchEnv.read({"PARATRAIN_PREVIOUS_RUN": "keep"})


@pytest.mark.parametrize("flag", ["resume", "fresh"])
def test_the_launcher_flag_reaches_every_rank(tmp_path: Path, flag: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    plan = make_plan(RunOptions(target=[str(script)], nproc="2", previous_run=flag), env={}, gpus=0)
    assert plan.env["PARATRAIN_PREVIOUS_RUN"] == flag


def test_fresh_wins_over_the_scripts_own_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's loop calls run.resume(); `paratrain run --fresh` starts over all the same."""
    first = _train(tmp_path, steps=2)
    monkeypatch.setenv("PARATRAIN_PREVIOUS_RUN", "fresh")
    second = _train(tmp_path, steps=1, resume=True)
    assert second.global_step == 1 and second.resumed_from is None
    assert (tmp_path / f"checkpoints.{first._checkpoints.identity.run_id}").is_dir()


def test_a_preempted_checkpoint_resumes_only_for_the_same_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another command in a preempted job's run dir is another run: refused, not resumed."""
    from paratrain.runtime import save_restore

    first = _train(tmp_path, steps=2)
    newest = first.store.latest_valid()
    assert newest is not None
    monkeypatch.setattr("sys.argv", ["train.py", "--lr", "0.1"])
    save_restore.mark_preempted(first.store, newest[0])
    monkeypatch.setattr("sys.argv", ["train.py", "--lr", "0.5"])
    with pytest.raises(ConfigError, match="did not resume from them"):
        _train(tmp_path, steps=1)
    monkeypatch.setattr("sys.argv", ["train.py", "--lr", "0.1"])
    assert _train(tmp_path, steps=1).global_step == 3


def test_a_model_that_does_not_fit_a_preempted_checkpoint_hints_fresh(tmp_path: Path) -> None:
    from paratrain.errors import CheckpointError
    from paratrain.runtime import save_restore

    first = _train(tmp_path, steps=1)
    newest = first.store.latest_valid()
    assert newest is not None
    save_restore.mark_preempted(first.store, newest[0])
    run = pt.Run(run_dir=tmp_path, progress=False, stats_every=None)
    net = torch.nn.Linear(4, 3)  # another model
    model, _opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(CheckpointError, match=r"does not fit.*paratrain run --fresh"):
        run.backward(model(torch.ones(8, 4)).sum())
    run.close()


def test_a_resume_that_would_come_after_the_forward_is_refused(tmp_path: Path) -> None:
    """A loop whose first training action is run.backward: a preempted checkpoint taken up
    there would replace the weights the loss was computed on. It is refused, naming the fix."""
    from paratrain.runtime import save_restore

    first = _train(tmp_path, steps=1)
    newest = first.store.latest_valid()
    assert newest is not None
    save_restore.mark_preempted(first.store, newest[0])
    run = pt.Run(run_dir=tmp_path, progress=False, stats_every=None)
    net = torch.nn.Linear(4, 2)
    model, _opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    loss = model(torch.ones(8, 4)).sum()
    with pytest.raises(ConfigError, match=r"after the forward.*call run.resume\(\) right after"):
        run.backward(loss)
    run.close()
