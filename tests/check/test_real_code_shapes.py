"""Shapes of correct code from public training repositories that ``paratrain check`` once
flagged (docs/rules/index.md, "On real code"), each written anew as a minimal case, and the
mistake beside it that must still be found."""

from __future__ import annotations

from pathlib import Path

from paratrain.commands.check.engine import check_paths
from tests.check.snippets import flagged

DIST = """
    import os
    import sys
    import torch
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter
    dist.init_process_group("nccl")
"""


def test_a_print_after_an_early_continue_of_the_ranks_without_a_writer_is_main_only() -> None:
    code = (
        DIST
        + """
    rank = dist.get_rank()
    writer = SummaryWriter("runs") if rank == 0 else None
    for step in range(10):
        loss = model(x).mean()
        loss.backward()
        if not writer:
            continue
        print(f"step {step} loss {loss.item()}")
    print("done")
"""
    )
    assert flagged(code, "PT016") == [17]  # the last print runs on every rank


def test_a_print_tagged_with_the_process_id_is_meant_per_process() -> None:
    code = (
        DIST
        + """
    for step in range(3):
        model(x).mean().backward()
        print(f"[pid {os.getpid()}] step {step}")
        print(f"step {step}")
"""
    )
    assert flagged(code, "PT016") == [12]


def test_a_type_test_against_the_old_scaler_class_is_not_a_use() -> None:
    code = """
    import torch
    def unwrap(scaler):
        if isinstance(scaler, torch.cuda.amp.GradScaler):
            return scaler.state_dict()
        return torch.cuda.amp.GradScaler()
"""
    assert flagged(code, "PT012") == [6]


def test_a_load_without_weights_only_for_torch_that_lacks_it_is_left_alone() -> None:
    code = """
    import torch
    def load(path):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except TypeError:  # torch < 1.13 has no weights_only
            return torch.load(path, map_location="cpu")
    state = torch.load("other.pt", map_location="cpu")
"""
    assert flagged(code, "PT008") == [8]


def test_nccl_with_models_moved_to_the_local_rank_is_a_gpu_only_script() -> None:
    gpu_only = """
    import os
    import torch
    import torch.distributed as dist
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl")
    model = torch.nn.Linear(4, 4).to(local_rank)
"""
    with_fallback = gpu_only.replace(
        ".to(local_rank)", '.to(torch.device("cuda" if torch.cuda.is_available() else "cpu"))'
    )
    assert flagged(gpu_only, "PT017") == []
    assert flagged(with_fallback, "PT017") == [6]


def test_test_modules_in_a_folder_get_the_api_rules_only(tmp_path: Path) -> None:
    body = (
        "import torch\n"
        "from torch import nn\n"
        "def test_data_parallel_state_dict():\n"
        "    model = nn.DataParallel(nn.Linear(2, 2))\n"
        "    state = torch.load('m.pt')\n"
    )
    (tmp_path / "tests").mkdir()
    test_file = tmp_path / "tests" / "test_wrappers.py"
    test_file.write_text(body)
    (tmp_path / "train.py").write_text(body.replace("def test_", "def run_"))
    report = check_paths([tmp_path])
    in_test = sorted(f.rule for f in report.findings if f.path.endswith("test_wrappers.py"))
    in_script = sorted(f.rule for f in report.findings if f.path.endswith("train.py"))
    assert in_test == ["PT008"] and "PT014" in in_script and report.test_modules == 1
    named = check_paths([test_file])  # named on the command line: every rule
    assert "PT014" in {f.rule for f in named.findings} and named.test_modules == 0


def test_the_orchestrator_branch_that_starts_torchrun_is_not_a_training_scope() -> None:
    code = """
    import subprocess
    import sys
    import torch.distributed as dist
    def worker():
        dist.init_process_group("nccl")
        loss = model(x).mean()
        loss.backward()
    def orchestrate():
        for n in (1, 2):
            print(f"running on {n} GPUs")
            subprocess.run([sys.executable, "-m", "torch.distributed.run", __file__, "--worker"])
    if "--worker" in sys.argv:
        worker()
    else:
        orchestrate()
"""
    assert flagged(code, "PT016") == []
    assert flagged(code.replace("    else:\n        orchestrate()", "    orchestrate()"), "PT016")


def test_a_message_each_rank_stops_with_is_not_a_log_line() -> None:
    code = (
        DIST
        + """
    def main():
        if torch.cuda.device_count() < 2:
            print("Need 2 GPUs. Exiting.")
            sys.exit()
        if bad:
            print("Error: --resume needs a checkpoint folder")
            return -1
        if late:
            print("finished early")
            return 0
        model(x).mean().backward()
    main()
"""
    )
    assert flagged(code, "PT016") == [17]  # "finished early" is not an error


def test_unittests_type_check_against_the_old_scaler_class() -> None:
    code = """
    import torch
    class T(unittest.TestCase):
        def test_scaler(self):
            self.assertIsInstance(wrapper.scaler, torch.cuda.amp.GradScaler)
"""
    assert flagged(code, "PT012") == []


def test_a_load_on_rank_0_is_not_a_save_that_others_must_wait_for() -> None:
    code = (
        DIST
        + """
    def load_sharded(path, local_rank):
        if local_rank == 0:
            state = torch.load(path, map_location="cpu", weights_only=True)
        else:
            state = torch.load(path, map_location="meta", weights_only=True)
        return state
"""
    )
    assert flagged(code, "PT026") == []
    saved = code.replace('state = torch.load(path, map_location="cpu", weights_only=True)',
                         "torch.save(model.state_dict(), path)")  # fmt: skip
    assert flagged(saved, "PT026") == [13]


def test_a_version_test_is_told_from_a_name_that_contains_the_word() -> None:
    code = """
    import torch
    if TORCH_VERSION < (1, 13):
        state = torch.load("a.pt")
    if not path.exists() or force_conversion:
        state = torch.load("b.pt")
"""
    assert flagged(code, "PT008") == [6]
