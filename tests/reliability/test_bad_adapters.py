"""Bad adapters are refused with a clear AdapterError, never loaded silently: a future format, a
damaged config field, flipped tensor bytes (the content hash), a head of another label count; old
adapters written before the hash existed still load. Also: a selection of nothing is an error."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from reliability_support import make_adapter, same_tensors, tiny_bert

from bitfit_hf import AdapterError, AutoBitFitModel, BitFitAdapter, BitFitConfig, apply_bitfit, load_adapter
from bitfit_hf.utils.constants import CONFIG_NAME, WEIGHTS_NAME


def rewrite_config(adapter_dir, **changes) -> None:
    """Change fields in both copies of the config (the side file and the one embedded in the weights)."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(adapter_dir, WEIGHTS_NAME)
    with open(path, "rb") as handle:
        data = handle.read()
    (length,) = struct.unpack("<Q", data[:8])
    metadata = json.loads(data[8 : 8 + length])["__metadata__"]
    config = json.loads(metadata["bitfit_adapter_config"])
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    text = json.dumps(config)
    save_file(load_file(path), path, metadata={**metadata, "bitfit_adapter_config": text})
    with open(os.path.join(adapter_dir, CONFIG_NAME), "w") as handle:
        handle.write(text)


@pytest.fixture
def adapter(tmp_path):
    return make_adapter(tmp_path)


def test_adapter_from_a_future_format_is_refused(adapter):
    _, adapter_dir, _ = adapter
    rewrite_config(adapter_dir, format_version=99)
    with pytest.raises(AdapterError, match=r"adapter format 99, written by a newer bitfit-hf.*Upgrade bitfit-hf"):
        BitFitAdapter.from_pretrained(str(adapter_dir))


@pytest.mark.parametrize("value", ["2", 0, True, None])
def test_a_format_version_that_is_not_a_version_is_refused(adapter, value):
    _, adapter_dir, _ = adapter
    rewrite_config(adapter_dir, format_version=value if value is not None else [2])
    with pytest.raises(AdapterError, match="not a valid adapter format"):
        BitFitAdapter.from_pretrained(str(adapter_dir))


def test_a_mistyped_config_field_is_named(adapter):
    _, adapter_dir, _ = adapter
    rewrite_config(adapter_dir, added_biases=["x"])
    with pytest.raises(AdapterError, match=r"field 'added_biases' should be a dict, found list"):
        BitFitAdapter.from_pretrained(str(adapter_dir))


def test_flipped_tensor_bytes_are_detected(adapter):
    _, adapter_dir, _ = adapter
    path = os.path.join(adapter_dir, WEIGHTS_NAME)
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0x7F  # inside the last tensor's data: still a valid safetensors file
    open(path, "wb").write(bytes(data))
    with pytest.raises(AdapterError, match=r"is corrupt: its tensors do not match the content hash.*Download the adapter again"):
        BitFitAdapter.from_pretrained(str(adapter_dir))


def test_the_hash_is_recorded_and_a_format_2_adapter_without_it_is_damaged(adapter):
    _, adapter_dir, _ = adapter
    config = json.load(open(os.path.join(adapter_dir, CONFIG_NAME)))
    assert config["format_version"] == 2 and config["tensors_sha256"].startswith("sha256:")
    rewrite_config(adapter_dir, tensors_sha256=None)
    with pytest.raises(AdapterError, match="format 2 but no tensors_sha256"):
        BitFitAdapter.from_pretrained(str(adapter_dir))


def test_format_1_adapters_without_a_hash_still_load_exactly(adapter):
    base_dir, adapter_dir, tensors = adapter
    rewrite_config(adapter_dir, tensors_sha256=None, format_version=1)
    loaded = BitFitAdapter.from_pretrained(str(adapter_dir))
    assert same_tensors(loaded.tensors, tensors)
    model = load_adapter(tiny_bert(seed=5), str(adapter_dir), check_base=False)
    assert torch.equal(dict(model.named_parameters())["classifier.bias"], tensors["classifier.bias"])


def test_a_resave_of_an_old_adapter_adds_the_hash(adapter, tmp_path):
    _, adapter_dir, tensors = adapter
    rewrite_config(adapter_dir, tensors_sha256=None, format_version=1)
    BitFitAdapter.from_pretrained(str(adapter_dir)).save_pretrained(str(tmp_path / "resaved"))
    config = json.load(open(tmp_path / "resaved" / CONFIG_NAME))
    assert config["format_version"] == 2 and config["tensors_sha256"]
    assert same_tensors(BitFitAdapter.from_pretrained(str(tmp_path / "resaved")).tensors, tensors)


def test_half_precision_saves_hash_what_they_write(adapter, tmp_path):
    _, adapter_dir, tensors = adapter
    BitFitAdapter.from_pretrained(str(adapter_dir)).save_pretrained(str(tmp_path / "half"), dtype="float16")
    loaded = BitFitAdapter.from_pretrained(str(tmp_path / "half"))
    assert all(t.dtype == torch.float16 for t in loaded.tensors.values())
    assert same_tensors(loaded.tensors, {k: v.half() for k, v in tensors.items()})


def test_auto_model_refuses_a_label_count_the_adapter_head_does_not_have(adapter):
    _, adapter_dir, _ = adapter
    with pytest.raises(AdapterError, match=r"head has 2 labels \(LABEL_0, LABEL_1\); num_labels=3 does not fit"):
        AutoBitFitModel.from_pretrained(str(adapter_dir), num_labels=3)
    with pytest.raises(AdapterError, match="num_labels=3 does not fit"):
        AutoBitFitModel.from_pretrained(str(adapter_dir), id2label={0: "a", 1: "b", 2: "c"})
    model = AutoBitFitModel.from_pretrained(str(adapter_dir), num_labels=2)  # agreeing is fine
    assert model.config.num_labels == 2


def test_selecting_nothing_is_an_error():
    from bitfit_hf import SelectionError

    with pytest.raises(SelectionError, match="selects nothing"):
        apply_bitfit(tiny_bert(), BitFitConfig("frozen", train_head=False))
    with pytest.raises(SelectionError, match=r"selects no parameter.*no task head"):
        import transformers as T

        apply_bitfit(T.BertModel(tiny_bert().config), BitFitConfig("frozen"))  # no head to train


def test_an_invalid_pattern_is_refused_when_the_config_is_made():
    from bitfit_hf import SelectionError

    with pytest.raises(SelectionError, match=r"Invalid regular expression in patterns: '\('"):
        BitFitConfig("all", patterns=["("])
