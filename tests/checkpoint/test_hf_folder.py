"""``paratrain ckpt convert --to hf``: a folder of size-capped safetensors shards and its index,
read back bit for bit, loadable with ``safetensors`` alone; bad folders and mappings refused
with nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import paratrain as pt
from paratrain.commands.cli import main
from tests.support.peak_memory import command_peak_bytes


class GPT(nn.Module):
    """A GPT-shaped model with tied input and output embeddings, written here."""

    def __init__(self, vocab: int = 96, d: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(16, d))
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        return self.head(self.ln(self.blocks(x)))  # type: ignore[no-any-return]


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(["ckpt", *args])
    except SystemExit as exit_info:
        code = int(exit_info.code or 0)
    out = capsys.readouterr()
    return code, out.out, " ".join(out.err.split())


@pytest.fixture
def trained(tmp_path: Path) -> tuple[GPT, Path]:
    """A GPT trained three steps by paratrain, and its checkpoint folder."""
    torch.manual_seed(0)
    model = GPT()
    tokens = torch.randint(0, 96, (24, 17))
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path / "ckpts", progress=False, seed=0) as run:
        wrapped, optimizer = run.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        for x, y in run.loader(data, batch_size=8):
            run.backward(nn.functional.cross_entropy(wrapped(x).flatten(0, 1), y.flatten()))
            run.step(optimizer)
        folder = run.save()
    assert folder is not None
    return model, folder


def test_a_trained_model_loads_from_the_folder_with_safetensors_alone(
    trained: tuple[GPT, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, folder = trained
    out = tmp_path / "hf"
    code, _said, err = _cli(
        ["convert", str(folder), str(out), "--to", "hf", "--max-shard-size", "20KB"], capsys
    )
    assert code == 0, err
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 2 and set(index["weight_map"].values()) == set(shards)
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    # The tied output layer is written once, under the embedding's name.
    assert index["metadata"]["tied"] == {"head.weight": "tok.weight"}
    assert "head.weight" not in index["weight_map"]
    unique = {id(p): p for p in model.state_dict(keep_vars=True).values()}.values()
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in unique)
    for shard in shards:  # each under the cap, or a single tensor larger than it
        held = load_file(str(out / shard))
        assert len(held) == 1 or sum(t.numel() * t.element_size() for t in held.values()) <= 20_000
    # What a plain reader does: every shard with safetensors, into a model built by hand.
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(str(out / shard)))
    plain = GPT()
    result = plain.load_state_dict(state, strict=False)
    assert result.missing_keys == ["head.weight"] and not result.unexpected_keys
    assert plain.head.weight is plain.tok.weight
    idx = torch.randint(0, 96, (2, 16))
    model.eval(), plain.eval()
    assert torch.equal(model(idx), plain(idx))


def test_round_trips_are_bit_exact_and_shards_deterministic(
    trained: tuple[GPT, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, folder = trained
    steps = [(folder, tmp_path / "a", "hf"), (tmp_path / "a", tmp_path / "b.pt", "pt"),
             (tmp_path / "b.pt", tmp_path / "c", "hf")]  # fmt: skip
    for src, dst, fmt in steps:
        args = ["convert", str(src), str(dst), "--to", fmt]
        assert _cli([*args, "--max-shard-size", "30KB"] if fmt == "hf" else args, capsys)[0] == 0
    code, out, _ = _cli(["diff", str(folder), str(tmp_path / "c"), "--json"], capsys)
    assert code == 0 and json.loads(out)["identical"]
    code, out, _ = _cli(["diff", str(tmp_path / "a"), str(tmp_path / "c"), "--json"], capsys)
    assert code == 0 and json.loads(out)["identical"]
    # The same conversion twice gives the same bytes, streamed (a folder) or not (a file).
    for src, fmt in ((folder, "hf"), (tmp_path / "b.pt", "hf"), (tmp_path / "a", "safetensors")):
        outs = [tmp_path / f"again-{fmt}-{src.name}-{i}" for i in range(2)]
        for out_path in outs:
            args = ["convert", str(src), str(out_path), "--to", fmt, "--max-shard-size", "30KB"]
            assert _cli(args, capsys)[0] == 0
        files = [sorted(p.rglob("*")) if p.is_dir() else [p] for p in outs]
        assert [f.relative_to(outs[0]) for f in files[0] if f != outs[0]] == [
            f.relative_to(outs[1]) for f in files[1] if f != outs[1]
        ]
        assert all(a.read_bytes() == b.read_bytes() for a, b in zip(*files, strict=True))


def _hf_folder(path: Path) -> dict[str, torch.Tensor]:
    """A folder as ``save_pretrained`` writes it (shards saved by the safetensors library)."""
    path.mkdir()
    state = {f"layer.{i}.weight": torch.randn(8, 8) for i in range(4)}
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save_file({k: state[k] for k in list(state)[:2]}, str(path / names[0]))
    save_file({k: state[k] for k in list(state)[2:]}, str(path / names[1]))
    weight_map = {k: names[i // 2] for i, k in enumerate(state)}
    index = {"metadata": {"total_size": 4 * 256}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return state


def test_a_hugging_face_folder_is_read_and_mapped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _hf_folder(tmp_path / "in")
    mapping = tmp_path / "names.json"
    mapping.write_text(json.dumps({"layer.": "blocks.", "layer.3.weight": None}))
    code, _, err = _cli(
        ["convert", str(tmp_path / "in"), str(tmp_path / "out.pt"), "--to", "pt", "--map",
         str(mapping)], capsys,
    )  # fmt: skip
    assert code == 0, err
    out = torch.load(tmp_path / "out.pt")
    assert sorted(out) == ["blocks.0.weight", "blocks.1.weight", "blocks.2.weight"]
    assert all(torch.equal(out[f"blocks.{i}.weight"], state[f"layer.{i}.weight"]) for i in range(3))
    rename = tmp_path / "names.py"
    rename.write_text("def rename(key):\n    return key.replace('layer.', 'h.')\n")
    code, _, err = _cli(
        ["convert", str(tmp_path / "in"), str(tmp_path / "h"), "--to", "hf", "--map",
         str(rename)], capsys,
    )  # fmt: skip
    assert code == 0, err
    assert sorted(load_file(str(tmp_path / "h" / "model.safetensors"))) == [
        f"h.{i}.weight" for i in range(4)
    ]


def _damage(folder: Path, how: str) -> str:
    """Break ``folder`` as ``how`` says; return what the error must name."""
    first, second = sorted(folder.glob("*.safetensors"))
    if how == "missing shard":
        second.unlink()
        return f"names 1 shard(s) the folder does not have: {second.name}"
    if how == "truncated shard":
        first.write_bytes(first.read_bytes()[:-100])
        return "is not a readable safetensors file"
    if how == "duplicate keys":
        save_file({"layer.0.weight": torch.zeros(8, 8), "layer.2.weight": torch.zeros(8, 8),
                   "layer.3.weight": torch.zeros(8, 8)}, str(second))  # fmt: skip
        return "'layer.0.weight' is in two shards"
    if how == "index from another save":
        save_file({"layer.2.weight": torch.zeros(8, 8)}, str(second))
        return "places 1 tensor(s) in model-00002-of-00002.safetensors that it does not hold"
    (folder / "model.safetensors.index.json").write_text("{not json")
    return "is not a readable index"


@pytest.mark.parametrize(
    "how",
    ["missing shard", "truncated shard", "duplicate keys", "index from another save", "bad index"],
)
def test_a_damaged_folder_is_one_paragraph_and_nothing_is_written(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _hf_folder(tmp_path / "in")
    named = _damage(tmp_path / "in", how)
    for fmt, out in (("pt", tmp_path / "out.pt"), ("hf", tmp_path / "out")):
        code, said, err = _cli(["convert", str(tmp_path / "in"), str(out), "--to", fmt], capsys)
        assert code == 2 and named in err and "Traceback" not in err, err
        assert not out.exists() and not said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # no half-written folder left


def test_bad_mappings_and_dtypes_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _hf_folder(tmp_path / "in")
    cases = {
        '{"layer.0.": "a."}': "leaves 3 tensor(s) of",
        '{"layer.0.weight": "w", "layer.1.weight": "w", "layer.": "h."}': "the same name",
        "[1, 2]": "must be one JSON object",
    }
    for text, named in cases.items():
        mapping = tmp_path / "m.json"
        mapping.write_text(text)
        code, _, err = _cli(
            ["convert", str(tmp_path / "in"), str(tmp_path / "out"), "--to", "hf", "--map",
             str(mapping)], capsys,
        )  # fmt: skip
        assert code == 2 and named in err, err
        assert not (tmp_path / "out").exists()
    torch.save({"w": torch.zeros(2, dtype=torch.complex128)}, tmp_path / "c.pt")
    code, _, err = _cli(["convert", str(tmp_path / "c.pt"), str(tmp_path / "out"), "--to", "hf"],
                        capsys)  # fmt: skip
    assert code == 2 and "cannot be written as safetensors shards" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "in", "m.json"]


def _peak_bytes(*args: str) -> int:
    """The memory a conversion held itself (``RssAnon``): file pages it maps are not counted."""
    return command_peak_bytes("ckpt", "convert", *args, anonymous=True)


def test_safetensors_conversions_hold_no_tensor_of_their_own(tmp_path: Path) -> None:
    """256 MiB of eight 32 MiB tensors, to an hf folder and back to one file: each tensor is a
    view of the mapped input, written from the page cache, so the memory the process holds
    beyond the same conversion of a tiny file is far below one tensor (reading each tensor into
    memory of its own: one tensor; reading the input whole: all of it)."""
    tensor = 32 * 2**20
    big = {f"layer.{i}.weight": torch.full((tensor // 4,), float(i)) for i in range(8)}
    save_file(big, str(tmp_path / "big.safetensors"))
    del big
    save_file({"w": torch.zeros(4)}, str(tmp_path / "tiny.safetensors"))
    baseline = _peak_bytes(str(tmp_path / "tiny.safetensors"), str(tmp_path / "t"), "--to", "hf")
    to_hf = _peak_bytes(str(tmp_path / "big.safetensors"), str(tmp_path / "hf"), "--to", "hf",
                        "--max-shard-size", "100MB")  # fmt: skip
    back = _peak_bytes(str(tmp_path / "hf"), str(tmp_path / "back.safetensors"), "--to",
                       "safetensors")  # fmt: skip
    assert len(list((tmp_path / "hf").glob("*.safetensors"))) == 4  # two 33.5 MB per 100 MB
    for peak in (to_hf, back):
        assert peak - baseline < tensor // 2, (peak - baseline) / 2**20
    restored = load_file(str(tmp_path / "back.safetensors"))
    assert sorted(restored) == [f"layer.{i}.weight" for i in range(8)]
    assert all(bool((restored[f"layer.{i}.weight"] == i).all()) for i in range(8))


def test_a_streamed_conversion_reports_its_progress_in_bytes(tmp_path: Path) -> None:
    from paratrain.checkpoint.inspection import convert

    _hf_folder(tmp_path / "in")
    seen: list[tuple[int, int]] = []
    convert(tmp_path / "in", tmp_path / "out.safetensors", to="safetensors",
            progress=lambda done, total: seen.append((done, total)))  # fmt: skip
    assert [done for done, _ in seen] == [256, 512, 768, 1024]  # four 8x8 fp32 tensors
    assert {total for _, total in seen} == {1024}


def test_a_torch_save_file_is_converted_without_a_copy_of_it_in_memory(tmp_path: Path) -> None:
    """256 MiB in a torch.save file, to pt, safetensors and hf: its tensors are mapped from the
    file and written from there, so the memory the process holds itself (``RssAnon``) grows by
    far less than one 32 MiB tensor beyond converting a tiny file. Loading the file whole held
    all 256 MiB, and a pt output was built in memory once more before it was written."""
    tensor = 32 * 2**20
    big = {f"layer.{i}.weight": torch.full((tensor // 4,), float(i)) for i in range(8)}
    torch.save(big, tmp_path / "big.pt")
    del big
    torch.save({"w": torch.zeros(4)}, tmp_path / "tiny.pt")

    def held(src: str, out: str, to: str) -> int:
        args = ("ckpt", "convert", str(tmp_path / src), str(tmp_path / out), "--to", to)
        return command_peak_bytes(*args, anonymous=True)

    for to, out in (("pt", "o.pt"), ("safetensors", "o.safetensors"), ("hf", "o")):
        baseline = held("tiny.pt", f"t-{out}", to)
        peak = held("big.pt", out, to)
        assert peak - baseline < tensor // 2, (to, (peak - baseline) / 2**20)
    back = torch.load(tmp_path / "o.pt", weights_only=True)
    assert sorted(back) == [f"layer.{i}.weight" for i in range(8)]
    assert all(bool((back[f"layer.{i}.weight"] == i).all()) for i in range(8))
    restored = load_file(str(tmp_path / "o.safetensors"))
    assert all(torch.equal(restored[k], back[k]) for k in back)


def test_a_torch_save_file_torch_cannot_map_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paratrain.checkpoint.loading import read_state_dict

    real = torch.load
    mapped: list[bool] = []

    def load(*args: Any, mmap: bool = False, **kwargs: Any) -> Any:
        mapped.append(mmap)
        if mmap:
            raise RuntimeError("this file cannot be mapped")
        return real(*args, **kwargs)

    torch.save({"w": torch.arange(4.0)}, tmp_path / "w.pt")
    monkeypatch.setattr(torch, "load", load)
    state, fmt = read_state_dict(tmp_path / "w.pt", lazy=True)
    assert torch.equal(state["w"], torch.arange(4.0)) and fmt == "torch.save (zip)"
    assert mapped == [True, False]
