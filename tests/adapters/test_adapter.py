"""The adapter format: round trip onto a stock model, base checks, broken input, atomic saves,
switching several adapters on one backbone, and merged export."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch
import transformers as T
from conftest import batch, tiny_model
from datasets import Dataset

from bitfit_hf import (
    AdapterBank,
    AdapterError,
    AutoBitFitModel,
    BaseModelMismatchError,
    BitFitAdapter,
    BitFitConfig,
    BitFitTrainer,
    apply_bitfit,
    export_merged,
    load_adapter,
    save_adapter,
)

TEXTS = ["a gorgeous, witty movie.", "boring and far too long.", "an utter delight.", "a tedious mess."] * 4


def train_minilm(minilm_dir, out, num_labels=2, bias_terms="all", seed=0, steps=4):
    torch.manual_seed(seed)
    model = T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=num_labels)
    tok = T.AutoTokenizer.from_pretrained(minilm_dir)
    enc = tok(TEXTS, padding="max_length", max_length=16)
    data = Dataset.from_dict({**enc, "labels": [i % num_labels for i in range(len(TEXTS))]})
    args = T.TrainingArguments(str(out), max_steps=steps, per_device_train_batch_size=8, learning_rate=1e-2, report_to=[],
                               use_cpu=True, save_strategy="no", disable_tqdm=True, seed=seed)
    trainer = BitFitTrainer(model, args, train_dataset=data, method_config=BitFitConfig(bias_terms),
                            base_model_name_or_path="sentence-transformers/all-MiniLM-L6-v2")
    trainer.train()
    trainer.save_model()
    return model.eval(), tok


def logits(model, tok, texts=TEXTS[:4]):
    with torch.no_grad():
        return model(**tok(texts, return_tensors="pt", padding=True)).logits


@pytest.fixture(scope="module")
def trained(minilm_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sst")
    model, tok = train_minilm(minilm_dir, out)
    return model, tok, str(out)


def stock(minilm_dir, num_labels=2, seed=123):
    torch.manual_seed(seed)  # a different random head than the trained model's: the adapter must bring its own
    return T.AutoModelForSequenceClassification.from_pretrained(minilm_dir, num_labels=num_labels).eval()


def test_round_trip_onto_a_fresh_stock_model_reproduces_logits(minilm_dir, trained):
    model, tok, out = trained
    fresh = stock(minilm_dir)
    assert not torch.equal(logits(fresh, tok), logits(model, tok))
    load_adapter(fresh, out)
    assert torch.equal(logits(fresh, tok), logits(model, tok))
    config = json.load(open(os.path.join(out, "adapter_config.json")))
    assert config["base_model_name_or_path"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert config["task_type"] == "SEQ_CLS" and config["architecture"] == "BertForSequenceClassification"
    assert len(config["trained_parameters"]) == 52 and config["base_fingerprint"].startswith("v1:")
    assert os.path.getsize(os.path.join(out, "adapter_model.safetensors")) < 150_000


def test_auto_model_builds_the_right_base(minilm_dir, trained):
    model, tok, out = trained
    auto = AutoBitFitModel.from_pretrained(out, base_model=minilm_dir).eval()
    assert type(auto).__name__ == "BertForSequenceClassification"
    assert torch.equal(logits(auto, tok), logits(model, tok))


def test_adapter_for_another_base_is_refused(minilm_dir, trained):
    _, _, out = trained
    other = stock(minilm_dir)
    with torch.no_grad():
        other.bert.encoder.layer[3].attention.self.key.weight.mul_(1.01)  # a different checkpoint
    with pytest.raises(BaseModelMismatchError, match=r"trained on base 'sentence-transformers/all-MiniLM-L6-v2'.*differ"):
        load_adapter(other, out)
    with pytest.raises(AdapterError, match=r"for a 'bert' model.*'distilbert'"):
        load_adapter(tiny_model("distilbert", num_labels=2), out)


def test_base_loaded_in_bfloat16_is_still_recognised(minilm_dir, trained):
    model, tok, out = trained
    half = stock(minilm_dir).to(torch.bfloat16)
    load_adapter(half, out)
    torch.testing.assert_close(logits(half, tok).float(), logits(model, tok), atol=0.1, rtol=0.05)


def test_head_size_mismatch_names_the_fix(minilm_dir, trained):
    _, _, out = trained
    with pytest.raises(AdapterError, match=r"Shape mismatch for classifier\.(weight|bias).*load the base with num_labels=2"):
        load_adapter(stock(minilm_dir, num_labels=5), out)


def copy_adapter(src, dst):
    os.makedirs(dst, exist_ok=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
            g.write(f.read())
    return dst


def test_broken_files_give_clear_errors(trained, tmp_path, minilm_dir):
    _, _, out = trained
    weights = "adapter_model.safetensors"
    data = open(os.path.join(out, weights), "rb").read()

    bad = copy_adapter(out, tmp_path / "truncated")
    open(os.path.join(bad, weights), "wb").write(data[: len(data) // 2])
    with pytest.raises(AdapterError, match="truncated or corrupt"):
        BitFitAdapter.from_pretrained(str(bad))

    bad = copy_adapter(out, tmp_path / "garbage")
    open(os.path.join(bad, weights), "wb").write(b"\x07" * 64)
    with pytest.raises(AdapterError, match="truncated or corrupt"):
        BitFitAdapter.from_pretrained(str(bad))

    # The weights embed the config, so a broken adapter_config.json beside them is ignored (with a warning)
    # (tests/reliability/test_kills_during_save.py); without an embedded config the side file is the
    # only description and its faults are errors.
    from safetensors.torch import load_file, save_file

    bare = copy_adapter(out, tmp_path / "bare")
    save_file(load_file(os.path.join(bare, weights)), os.path.join(bare, weights))
    bad = copy_adapter(bare, tmp_path / "notjson")
    open(os.path.join(bad, "adapter_config.json"), "w").write("{not json")
    with pytest.raises(AdapterError, match="adapter_config.json is not valid JSON"):
        BitFitAdapter.from_pretrained(str(bad))

    bad = copy_adapter(bare, tmp_path / "fields")
    config = json.load(open(os.path.join(out, "adapter_config.json")))
    del config["base_fingerprint"], config["trained_parameters"]
    json.dump(config, open(os.path.join(bad, "adapter_config.json"), "w"))
    with pytest.raises(AdapterError, match=r"misses required field\(s\) \['trained_parameters', 'base_fingerprint'\]"):
        BitFitAdapter.from_pretrained(str(bad))

    with pytest.raises(AdapterError, match="No adapter directory"):
        load_adapter(stock(minilm_dir), str(tmp_path / "missing"))


class _Trap:
    """Unpickling this writes a marker file: proof that a loader unpickled it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_files_are_refused_and_never_unpickled(trained, tmp_path):
    _, _, out = trained
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Trap(str(marker)))
    renamed = copy_adapter(out, tmp_path / "renamed")
    open(os.path.join(renamed, "adapter_model.safetensors"), "wb").write(payload)
    with pytest.raises(AdapterError, match="pickle"):
        BitFitAdapter.from_pretrained(str(renamed))
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "adapter_model.bin").write_bytes(payload)
    with pytest.raises(AdapterError, match=r"adapter_model.bin \(a pickle\).*never unpickles"):
        BitFitAdapter.from_pretrained(str(binary))
    assert not marker.exists()


def test_crash_mid_save_keeps_the_previous_adapter(trained, tmp_path, monkeypatch, minilm_dir):
    model, tok, out = trained
    target = copy_adapter(out, tmp_path / "adapter")
    expected = logits(model, tok)
    fresh = stock(minilm_dir)
    apply_bitfit(fresh)
    with torch.no_grad():
        fresh.bert.encoder.layer[0].intermediate.dense.bias.add_(1.0)  # a different adapter to save

    real_fsync, calls = os.fsync, []

    def crash(fd):  # the config JSON is written whole; the power goes while the weights are flushed
        calls.append(fd)
        if len(calls) == 2:
            raise KeyboardInterrupt("power cut")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(KeyboardInterrupt):
        save_adapter(fresh, str(target))
    monkeypatch.undo()
    assert sorted(os.listdir(target)) == ["adapter_config.json", "adapter_model.safetensors"]  # no temp files left
    reloaded = load_adapter(stock(minilm_dir), str(target))  # the config json was replaced, the weights were not
    assert torch.equal(logits(reloaded, tok), expected)


def test_saves_are_byte_for_byte_reproducible(trained, tmp_path):
    _, _, out = trained
    adapter = BitFitAdapter.from_pretrained(out)
    adapter.save_pretrained(str(tmp_path / "one"))
    adapter.save_pretrained(str(tmp_path / "two"))
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_half_precision_storage(trained, tmp_path, minilm_dir):
    model, tok, out = trained
    half_dir = tmp_path / "fp16"
    BitFitAdapter.from_pretrained(out).save_pretrained(str(half_dir), dtype="float16")
    full_size = os.path.getsize(os.path.join(out, "adapter_model.safetensors"))
    assert os.path.getsize(half_dir / "adapter_model.safetensors") < 0.6 * full_size
    loaded = load_adapter(stock(minilm_dir), str(half_dir))
    torch.testing.assert_close(logits(loaded, tok), logits(model, tok), atol=2e-3, rtol=1e-3)


def test_bank_switches_tasks_in_place_and_restores_the_base(minilm_dir, trained, tmp_path):
    model_a, tok, out_a = trained
    model_b, _, out_b = train_minilm(minilm_dir, tmp_path / "three", num_labels=3, bias_terms="paper-subset", seed=1)[0], None, str(tmp_path / "three")
    base = stock(minilm_dir)
    base_biases = {n: p.detach().clone() for n, p in base.named_parameters() if n.endswith("bias")}
    weights_before = {n: p.data_ptr() for n, p in base.named_parameters() if n.endswith("weight") and "classifier" not in n}
    bank = AdapterBank(base)
    bank.add("sentiment", out_a)
    bank.add("three_way", out_b)
    bank.activate("three_way")
    assert torch.equal(logits(base, tok), logits(model_b, tok)) and base.config.num_labels == 3
    bank.activate("sentiment")
    assert torch.equal(logits(base, tok), logits(model_a, tok)) and base.config.num_labels == 2
    bank.restore_base()
    for n, p in base.named_parameters():
        if n in base_biases:
            assert torch.equal(p, base_biases[n]), n
    assert weights_before == {n: p.data_ptr() for n, p in base.named_parameters() if n in weights_before}
    with pytest.raises(KeyError, match="loaded: \\['sentiment', 'three_way'\\]"):
        bank.activate("nope")


def test_export_merged_checkpoint_loads_with_plain_transformers(trained, tmp_path):
    model, tok, _ = trained
    export_merged(model, str(tmp_path / "merged"), tokenizer=tok)
    plain = T.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "merged")).eval()
    assert torch.equal(logits(plain, tok), logits(model, tok))
    assert "bitfit" not in open(tmp_path / "merged" / "config.json").read().lower()


def test_export_of_added_linear_biases_sets_the_config_switches(tmp_path):
    model = tiny_model("llama")
    apply_bitfit(model, BitFitConfig(["b_q", "b_m2"], add_missing_biases=True))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    export_merged(model, str(tmp_path / "llama"))
    plain = T.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "llama")).eval()
    assert plain.config.attention_bias and plain.config.mlp_bias
    inputs = batch()
    with torch.no_grad():
        torch.testing.assert_close(plain(**inputs).logits, model(**inputs).logits, rtol=0, atol=1e-6)


def test_export_refuses_norm_biases_the_stock_class_cannot_hold(tmp_path):
    model = tiny_model("llama")
    apply_bitfit(model, BitFitConfig(["b_LN1"], add_missing_biases=True))
    with pytest.raises(AdapterError, match="input_layernorm.*no bias for"):
        export_merged(model, str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_added_bias_adapter_round_trip_on_a_biasless_model(tmp_path):
    model = tiny_model("llama")
    apply_bitfit(model, BitFitConfig("all", add_missing_biases=True))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    save_adapter(model, str(tmp_path / "a"))
    fresh = tiny_model("llama")
    load_adapter(fresh, str(tmp_path / "a"))
    inputs = batch()
    with torch.no_grad():
        assert torch.equal(fresh(**inputs).logits, model(**inputs).logits)
