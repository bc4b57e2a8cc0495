"""PT006 (wrapper state dict), PT007 (pickled module), PT008/PT009 (torch.load arguments)."""

from __future__ import annotations

from tests.check.snippets import flagged


def test_state_dict_of_a_ddp_wrapper_is_found() -> None:
    bad = """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(MyModel().cuda(), device_ids=[local_rank])
        torch.save(model.state_dict(), "model.pth")
        torch.save({"model": model.state_dict(), "epoch": 3}, "ckpt.pth")
    """
    assert flagged(bad, "PT006") == [5, 6]


def test_unwrapped_or_type_tested_state_dicts_are_fine() -> None:
    good = """
        import torch
        model = MyModel()
        if torch.cuda.device_count() > 1:
            model = torch.nn.DataParallel(model)
        if isinstance(model, torch.nn.DataParallel):
            torch.save(model.module.state_dict(), "model.pth")
        else:
            torch.save(model.state_dict(), "model.pth")
        plain = MyModel()
        torch.save(plain.state_dict(), "plain.pth")
    """
    assert flagged(good, "PT006") == []


def test_whole_module_saved_is_found() -> None:
    bad = """
        import torch
        from torch import nn
        class Net(nn.Module):
            pass
        model = Net().to("cuda")
        torch.save(model, "model.pkl")
        layer = nn.Linear(2, 2)
        torch.save(layer, "layer.pkl")
    """
    assert flagged(bad, "PT007") == [7, 9]


def test_saving_tensors_and_unknown_objects_is_fine() -> None:
    good = """
        import torch
        model = build_model()
        torch.save(model, "m.pt")
        weights = torch.nn.Parameter(torch.ones(2))
        torch.save(weights, "w.pt")
        torch.save(Net().state_dict(), "n.pt")
    """
    assert flagged(good, "PT007") == []


def test_torch_load_without_weights_only_is_found() -> None:
    source = """
        import torch
        a = torch.load("model.pth")
        b = torch.load("model.pth", map_location="cpu", weights_only=True)
        c = torch.load("model.pth", weights_only=False)
    """
    assert flagged(source, "PT008") == [3]


def test_torch_load_without_map_location_in_a_distributed_script() -> None:
    source = """
        import io
        import torch
        import torch.distributed as dist
        a = torch.load("model.pth", weights_only=True)
        b = torch.load("model.pth", map_location="cpu", weights_only=True)
        c = torch.load(io.BytesIO(payload), weights_only=True)
    """
    assert flagged(source, "PT009") == [5]
    single = source.replace("import torch.distributed as dist", "")
    assert flagged(single, "PT009") == []


def test_a_model_the_fragment_never_binds_is_taken_for_a_module() -> None:
    """Tutorials show ``torch.save(model, 'model.pkl')`` alone; a bound or imported name, or one
    a star import may bind, keeps needing a module origin."""
    assert flagged("import torch\ntorch.save(model, 'model.pkl')\n", "PT007") == [2]
    good = """
        import torch
        from mypkg import model
        torch.save(model, "a.pt")
        torch.save(state, "b.pt")
        def save(ddp_model):
            torch.save(ddp_model, "c.pt")
    """
    assert flagged(good, "PT007") == []
    assert flagged("import torch\nfrom mypkg import *\ntorch.save(model, 'm.pt')\n", "PT007") == []


def test_a_load_inside_safe_globals_means_weights_only() -> None:
    code = """
    import torch
    with torch.serialization.safe_globals([Config]):
        state = torch.load("m.pt", map_location="cpu")
    other = torch.load("m.pt", map_location="cpu")
    """
    assert flagged(code, "PT008") == [5]
