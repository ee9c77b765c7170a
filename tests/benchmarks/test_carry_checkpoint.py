"""``benchmarks/carry_checkpoint.py``: a checkpoint folder split into checked parts and written back, the matrices
rounded to float16 and widened again, every other tensor and file exact; missing or damaged parts refused before
anything is written."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def carry(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("carry_checkpoint")


@pytest.fixture
def checkpoint(tmp_path):
    folder = tmp_path / "model"
    (folder / "1_Pooling").mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    tensors = {"encoder.dense.weight": torch.randn(64, 48, generator=generator),
               "encoder.dense.bias": torch.randn(64, generator=generator) * 1e-3,
               "encoder.norm.weight": torch.rand(64, generator=generator) + 0.5,
               "embeddings.position_ids": torch.arange(16).unsqueeze(0)}
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "mpnet", "hidden_size": 64}))
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    return folder, tensors


def test_a_folder_travels_in_parts_and_loads_back(carry, checkpoint, tmp_path):
    folder, tensors = checkpoint
    parts = tmp_path / "parts"
    manifest = carry.pack(str(folder), str(parts), part_mib=2048 / 2**20)  # 2 KiB parts: several of them
    assert len(manifest["parts"]) > 2
    assert all(part["bytes"] <= 2048 for part in manifest["parts"]) and manifest["compression"] == "xz"
    assert manifest["widen"] == {"encoder.dense.weight": "float32"}  # only the float matrix is rounded
    assert carry.problems(str(parts), manifest) == []
    dest = carry.unpack(str(parts), str(tmp_path / "back"))
    back = load_file(str(Path(dest) / "model.safetensors"))
    assert set(back) == set(tensors)
    assert all(back[name].dtype == tensors[name].dtype for name in tensors)
    for name in ("encoder.dense.bias", "encoder.norm.weight", "embeddings.position_ids"):
        assert torch.equal(back[name], tensors[name])  # what BitFit trains starts exactly where it would
    weight = tensors["encoder.dense.weight"]
    assert torch.equal(back["encoder.dense.weight"], weight.half().float())
    assert not torch.equal(back["encoder.dense.weight"], weight)
    assert (Path(dest) / "config.json").read_text() == (folder / "config.json").read_text()
    assert (Path(dest) / "1_Pooling" / "config.json").is_file()
    # the same folder packs to the same bytes (the study's cells name the unpacked folder as their base)
    again = carry.pack(str(folder), str(tmp_path / "again"), part_mib=2048 / 2**20)
    assert again["sha256"] == manifest["sha256"]


def test_missing_or_damaged_parts_are_named_and_nothing_is_written(carry, checkpoint, tmp_path, capsys):
    folder, _ = checkpoint
    parts = tmp_path / "parts"
    assert carry.main(["pack", str(folder), str(parts), "--part-mib", str(2048 / 2**20)]) == 0
    (parts / "part-001").unlink()
    damaged = parts / "part-002"
    damaged.write_bytes(b"x" + damaged.read_bytes()[1:])
    assert carry.main(["check", str(parts)]) == 1
    out = capsys.readouterr().out
    assert "part-001: missing" in out and "part-002: damaged" in out
    dest = tmp_path / "back"
    assert carry.main(["unpack", str(parts), str(dest)]) == 2
    err = capsys.readouterr().err
    assert "part-001: missing" in err and "Carry those parts again (nothing was written)" in err
    assert not dest.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model", "parts"]


def test_bad_input_gets_one_clear_line(carry, checkpoint, tmp_path, capsys):
    folder, _ = checkpoint
    assert carry.main(["pack", str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    assert "not a folder with files in it" in capsys.readouterr().err
    assert carry.main(["pack", str(folder), str(tmp_path / "out"), "--part-mib", "0"]) == 2
    assert "positive size" in capsys.readouterr().err
    assert carry.main(["pack", str(folder), str(folder)]) == 2  # a folder holding files: parts must not mix
    assert "already holds files" in capsys.readouterr().err
    assert carry.main(["unpack", str(tmp_path), str(tmp_path / "dest")]) == 2
    assert "no manifest" in capsys.readouterr().err
    parts = tmp_path / "parts"
    carry.pack(str(folder), str(parts), part_mib=1)
    assert carry.main(["unpack", str(parts), str(folder)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_a_folder_without_weights_travels_exactly(carry, tmp_path):
    data = tmp_path / "assets" / "squad_dev"
    data.mkdir(parents=True)
    (data / "dev.json").write_bytes(bytes(range(256)) * 40)
    manifest = carry.pack(str(tmp_path / "assets"), str(tmp_path / "parts"), part_mib=4096 / 2**20, compress=False)
    assert manifest["widen"] == {} and manifest["compression"] is None and len(manifest["parts"]) > 2
    back = Path(carry.unpack(str(tmp_path / "parts"), str(tmp_path / "back")))
    assert (back / "squad_dev" / "dev.json").read_bytes() == (data / "dev.json").read_bytes()


def test_the_plan_fits_every_part_into_as_few_transfers_as_hold_them(carry, tmp_path, capsys):
    def parts(name, sizes):
        folder = tmp_path / name
        folder.mkdir()
        listed = []
        for index, size in enumerate(sizes):
            (folder / f"part-{index:03d}").write_bytes(b"x" * size)
            listed.append({"name": f"part-{index:03d}", "bytes": size, "sha256": ""})
        (folder / "manifest.json").write_text(json.dumps({"format": carry.FORMAT, "parts": listed}))
        return str(folder)

    kib = 1024
    weights, data = parts("weights", [50 * kib, 50 * kib, 10 * kib]), parts("data", [30 * kib])
    calls = carry.plan([weights, data], call_mib=58 / 1024, with_first=[])
    assert len(calls) == 3  # 110 KiB of parts and two manifests in 58 KiB transfers: three, not four
    assert calls[0][:2] == [f"{weights}/manifest.json", f"{data}/manifest.json"]
    carried = [path for call in calls for path in call if "part-" in path]
    assert sorted(carried) == sorted(f"{d}/part-{i:03d}" for d, n in ((weights, 3), (data, 1)) for i in range(n))
    for call in calls:
        assert sum(os.path.getsize(p) for p in call) <= 58 * kib
    assert carry.main(["plan", weights, "--call-mib", str(40 / 1024)]) == 2
    assert "more than --call-mib" in capsys.readouterr().err
