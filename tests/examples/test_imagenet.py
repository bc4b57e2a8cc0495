"""examples/imagenet: the built-in vision pieces, and the script end to end on 2 CPU ranks.

The end-to-end tests share one training run (resnet18, 32x32 PNGs of 6 colour classes, 3
epochs): it is resumed for a 4th epoch, and its best weights are evaluated in a run of their own.
Bad input (a DIR without the class folders, flags out of range) stops the script with status 2
and one message saying what to do, before the run starts.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tests.examples.support import EXAMPLES, metrics, refusal, run_example, run_scripts

pytestmark = pytest.mark.examples

SCRIPT = "imagenet/main.py"
COLOURS = [(220, 40, 40), (40, 200, 40), (40, 40, 220),
           (220, 220, 40), (200, 40, 200), (40, 200, 200)]  # fmt: skip
# 3 epochs of 5 steps; the learning rate drops 10x at epoch 2 (checked after the resume).
TINY = ["-a", "resnet18", "--image-size", "32", "-b", "16", "--lr", "0.002", "--lr-step", "2",
        "-j", "0", "-p", "2", "--channels-last"]  # fmt: skip


def load_vision() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "imagenet_vision", EXAMPLES / "imagenet/vision.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vision = load_vision()


def write_png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8)).save(path)


def make_image_folder(root: Path, train: int = 12, val: int = 4, size: int = 32) -> Path:
    """train/ and val/ of noisy one-colour images, a class per colour."""
    rng = np.random.default_rng(0)
    for split, count in (("train", train), ("val", val)):
        for c, colour in enumerate(COLOURS):
            for i in range(count):
                noise = rng.normal(0, 40, (size, size, 3))
                write_png(
                    root / split / f"class{c}" / f"{i:03d}.png", np.clip(noise + colour, 0, 255)
                )
    return root


def output(proc: Any) -> str:
    return proc.stdout + proc.stderr


def epoch_lines(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"^=> epoch (\d+) of \d+:", text, re.M)]


def newest_checkpoint(run_dir: Path) -> Path:
    return max((run_dir / "checkpoints").glob("step-*"), key=lambda p: p.name)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 3-epoch run; its best weights and their accuracy are copied before any test runs."""
    root = tmp_path_factory.mktemp("imagenet")
    data = make_image_folder(root / "data")
    run_dir = root / "run"
    proc = run_example(SCRIPT, str(data), *TINY, "--epochs", "3", run_dir=run_dir)
    rows = metrics(run_dir)
    best = root / "best.pt"
    shutil.copy(run_dir / "model_best.pt", best)
    trainer = torch.load(newest_checkpoint(run_dir) / "trainer.pt", weights_only=True)
    return {"data": data, "run_dir": run_dir, "text": output(proc), "rows": rows, "best": best,
            "extras": trainer["extras"], "root": root}  # fmt: skip


# -- end to end --------------------------------------------------------------------------------
def test_training_learns_and_reports_once_per_epoch(trained: dict[str, Any]) -> None:
    text, rows = trained["text"], trained["rows"]
    assert "=> images and models:" in text and ("built-in" in text or "torchvision" in text)
    assert text.count("=> images and models:") == 1, "only the main process prints"
    assert epoch_lines(text) == [0, 1, 2]
    assert [row["epoch"] for row in rows] == [0, 1, 2]
    assert [row["step"] for row in rows] == [5, 10, 15]  # 72 images / global batch 16, per epoch
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]
    for row in rows:
        for split in ("train", "val"):
            acc1, acc5 = row[f"{split}/acc1"], row[f"{split}/acc5"]
            assert 0 <= acc1 <= acc5 <= 100
        # 24 validation images: every one counted once over both ranks
        assert round(row["val/acc1"] * 24 / 100, 6).is_integer()
    assert [row["lr"] for row in rows] == pytest.approx([0.002, 0.002, 0.0002])
    assert trained["extras"]["best_acc1"] == max(row["val/acc1"] for row in rows)
    assert trained["extras"]["arch"] == "resnet18"


def test_best_weights_load_with_plain_torch(trained: dict[str, Any]) -> None:
    state = torch.load(trained["best"], weights_only=True)
    model = vision.resnet18(num_classes=len(COLOURS))
    model.load_state_dict(state, strict=True)
    assert "layer1.0.conv1.weight" in state and "fc.weight" in state


def test_checkpoint_weights_load_with_safetensors(trained: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    state = load_file(newest_checkpoint(trained["run_dir"]) / "model.safetensors")
    model = vision.resnet18(num_classes=len(COLOURS))
    model.load_state_dict(state, strict=True)


def test_evaluate_reproduces_the_best_accuracy(trained: dict[str, Any]) -> None:
    run_dir = trained["root"] / "evaluate"
    proc = run_example(SCRIPT, str(trained["data"]), *TINY, "--evaluate", "--resume",
                       str(trained["best"]), run_dir=run_dir)  # fmt: skip
    text = output(proc)
    assert f"=> loading weights '{trained['best']}'" in text
    assert "Epoch: [" not in text and epoch_lines(text) == []
    (row,) = metrics(run_dir)
    assert row["val/acc1"] == trained["extras"]["best_acc1"]
    assert f" * Acc@1 {trained['extras']['best_acc1']:.3f}" in text


def test_resume_continues_from_the_saved_epoch(trained: dict[str, Any]) -> None:
    run_dir = trained["run_dir"]
    args = [str(trained["data"]), *TINY, "--epochs", "4", "--resume", "--precision", "bf16"]
    text = output(run_example(SCRIPT, *args, run_dir=run_dir))
    assert "=> resumed from" in text and "(epoch 3)" in text
    assert "precision bf16" in text
    assert epoch_lines(text) == [3]
    assert "Epoch: [0]" not in text and "Epoch: [3]" in text
    rows = metrics(run_dir)
    assert [row["epoch"] for row in rows] == [0, 1, 2, 3]
    assert rows[-1]["step"] == 20
    assert rows[-1]["lr"] == pytest.approx(0.0002)  # the scheduler came back with the checkpoint
    assert rows[-1]["best_acc1"] >= trained["extras"]["best_acc1"]


# -- bad input ---------------------------------------------------------------------------------
LAYOUT = "DIR must hold train/ and val/, one folder of images per class"
COUNT = "pass a whole number of at least 1"
REFUSED = {  # case: (arguments, the message); the `refused` fixture makes the folders
    "no-dir": (["nowhere"], f"nowhere: no such folder. {LAYOUT}"),
    "no-images": (["no_images", "--evaluate"], "Found no valid file for the classes a"),
    "epochs": (["--epochs", "0"], f"argument --epochs: got '0'; {COUNT}"),
    "batch-size": (["-b", "0"], f"argument -b/--batch-size: got '0'; {COUNT}"),
    "lr": (["--lr", "0"], "argument --lr/--learning-rate: got '0'; pass a number above 0"),
    "workers": (["-j", "-1"], "argument -j/--workers: got '-1'; pass a whole number of at least 0"),
    "image-size": (["--image-size", "0"], f"argument --image-size: got '0'; {COUNT}"),
    "print-freq": (["-p", "0"], f"argument -p/--print-freq: got '0'; {COUNT}"),
}


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Every REFUSED case, run four at a time (a start that imports torch takes seconds) in a
    folder that holds the bad folders and nothing else."""
    root = tmp_path_factory.mktemp("imagenet_bad_input")
    (root / "no_images" / "val" / "a").mkdir(parents=True)
    (root / "no_images" / "val" / "a" / "notes.txt").write_text("not an image")
    commands = {case: [str(EXAMPLES / SCRIPT), *args] for case, (args, _) in REFUSED.items()}
    return root, run_scripts(commands, root)


@pytest.mark.parametrize("case", REFUSED)
def test_bad_input_stops_with_one_message(case: str, refused: tuple[Path, dict[str, Any]]) -> None:
    root, procs = refused
    message = refusal(procs[case])
    assert REFUSED[case][1] in message
    if case.startswith("no-"):  # the fix: the layout DIR needs
        assert message.endswith(f"{LAYOUT} (--evaluate needs only val/).")
    assert not (root / "runs").exists(), "the run never started"


# -- the built-in pieces (used when torchvision does not import) ----------------------------------
def test_image_folder_finds_classes_sorted(tmp_path: Path) -> None:
    for name in ("b/2.png", "b/1.png", "a/x/3.png", "a/0.png", "c/9.jpg"):
        write_png(tmp_path / name, np.zeros((4, 6, 3)))
    write_png(tmp_path / "c/5.png", np.zeros((4, 6)))  # greyscale: loaded as RGB
    (tmp_path / "b/notes.txt").write_text("not an image")
    folder = vision.ImageFolder(tmp_path)
    assert folder.classes == ["a", "b", "c"]
    assert folder.class_to_idx == {"a": 0, "b": 1, "c": 2}
    names = [Path(p).relative_to(tmp_path).as_posix() for p, _ in folder.samples]
    assert names == ["a/0.png", "a/x/3.png", "b/1.png", "b/2.png", "c/5.png", "c/9.jpg"]
    assert folder.targets == [0, 0, 1, 1, 2, 2]
    image, target = folder[4]
    assert (image.mode, image.size, target) == ("RGB", (6, 4), 2)
    (tmp_path / "d").mkdir()
    with pytest.raises(FileNotFoundError, match="no valid file for the classes d"):
        vision.ImageFolder(tmp_path)


def test_resize_and_center_crop_follow_torchvision() -> None:
    image = Image.fromarray(np.arange(30 * 40 * 3, dtype=np.uint8).reshape(30, 40, 3) % 251)
    assert vision.Resize(16)(image).size == (21, 16)  # shorter side to 16, int(16 * 40 / 30)
    assert vision.Resize((10, 12))(image).size == (12, 10)
    crop = vision.CenterCrop(10)(image)
    assert np.array_equal(np.array(crop), np.array(image)[10:20, 15:25])
    padded = np.array(vision.CenterCrop((34, 40))(image))
    assert padded.shape == (34, 40, 3) and not padded[:2].any() and not padded[-2:].any()
    assert np.array_equal(padded[2:32], np.array(image))
    tensor = vision.ToTensor()(image)  # the same on C x H x W tensors
    assert vision.Resize(16)(tensor).shape == (3, 16, 21)
    assert torch.equal(vision.CenterCrop(10)(tensor), tensor[:, 10:20, 15:25])
    padded_tensor = vision.CenterCrop((34, 40))(tensor)
    assert torch.equal(padded_tensor[:, 2:32], tensor) and not padded_tensor[:, :2].any()
    assert torch.equal(vision.RandomHorizontalFlip(p=1.0)(tensor), tensor.flip(-1))


def test_random_transforms_draw_from_torch() -> None:
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 40, 3), dtype=np.uint8))
    crop = vision.RandomResizedCrop(24)
    torch.manual_seed(1)
    first = np.array(crop(image))
    torch.manual_seed(1)
    assert np.array_equal(first, np.array(crop(image))) and first.shape == (24, 24, 3)
    for _ in range(200):
        top, left, h, w = crop.get_params(image, crop.scale, crop.ratio)
        assert 0 <= top <= top + h <= 30 and 0 <= left <= left + w <= 40
        assert 0.08 * 1200 * 0.75 <= h * w <= 1200
    whole = vision.RandomResizedCrop(20, scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3))(image)
    assert np.array_equal(
        np.array(whole), np.array(image.resize((20, 20), Image.Resampling.BILINEAR))
    )
    flipped = vision.RandomHorizontalFlip(p=1.0)(image)
    assert np.array_equal(np.array(flipped), np.array(image)[:, ::-1])
    assert vision.RandomHorizontalFlip(p=0.0)(image) is image


def test_to_tensor_and_normalize() -> None:
    pixels = np.zeros((5, 7, 3), dtype=np.uint8)
    pixels[..., 0], pixels[0, 0, 1] = 255, 51
    tensor = vision.ToTensor()(Image.fromarray(pixels))
    assert tensor.shape == (3, 5, 7) and tensor.dtype == torch.float32
    assert tensor[0].eq(1).all() and tensor[1, 0, 0].item() == pytest.approx(0.2)
    assert tensor[2].eq(0).all()
    out = vision.Normalize(mean=[0.5, 0.2, 0.0], std=[0.5, 0.1, 2.0])(tensor)
    assert out[0].eq(1).all() and out[1, 0, 0].item() == pytest.approx(0.0, abs=1e-6)
    assert out[1, 1, 1].item() == pytest.approx(-2.0) and out[2].eq(0).all()
    assert tensor[0].eq(1).all(), "the input is left as it was"
    val = vision.Compose([vision.Resize(36), vision.CenterCrop(32), vision.ToTensor()])
    assert val(Image.fromarray(np.zeros((40, 60, 3), dtype=np.uint8))).shape == (3, 32, 32)


def test_resnets_have_torchvision_names_and_sizes() -> None:
    r50, r18 = vision.resnet50(), vision.resnet18()
    assert sum(p.numel() for p in r50.parameters()) == 25_557_032
    assert sum(p.numel() for p in r18.parameters()) == 11_689_512
    names = r50.state_dict().keys()
    for name in ("conv1.weight", "bn1.running_mean", "layer1.0.conv1.weight",
                 "layer1.0.conv3.weight", "layer1.0.downsample.0.weight",
                 "layer4.2.bn3.running_var", "fc.weight", "fc.bias"):  # fmt: skip
        assert name in names
    assert "layer1.0.conv3.weight" not in r18.state_dict()
    assert r50.layer2[0].conv2.stride == (2, 2) and r50.layer2[0].conv1.stride == (1, 1)
    assert r50.fc.in_features == 2048 and r18.fc.in_features == 512
    model = vision.create_model("resnet18", num_classes=6)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 6)
    with pytest.raises(ValueError, match="unknown architecture 'resnet5'"):
        vision.create_model("resnet5")


@pytest.mark.parametrize("block", ["basic", "bottleneck"])
def test_blocks_add_the_shortcut(block: str) -> None:
    """With the last BatchNorm of the branch zeroed, a block passes its (non-negative) input."""
    torch.manual_seed(0)
    if block == "basic":
        b = vision.BasicBlock(8, 8)
        last = b.bn2
    else:
        b = vision.Bottleneck(32, 8)
        last = b.bn3
    torch.nn.init.zeros_(last.weight)
    b.eval()
    x = torch.relu(torch.randn(2, b.conv1.in_channels, 6, 6))
    assert torch.equal(b(x), x)
    torch.nn.init.ones_(last.weight)
    assert not torch.allclose(b(x), x)


def test_state_dicts_match_torchvision() -> None:
    if vision.models is None:
        pytest.skip(f"torchvision does not import here: {vision.BACKEND}")
    for arch in ("resnet18", "resnet50"):
        ours = {k: v.shape for k, v in getattr(vision, arch)().state_dict().items()}
        theirs = {k: v.shape for k, v in vision.models.__dict__[arch]().state_dict().items()}
        assert ours == theirs
