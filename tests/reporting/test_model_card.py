"""The bias-change heat map (the paper's Figure 1) and the generated model card.

Unit tests run in-process and need no server; the ``hub``-marked test checks the card with
``ModelCard.validate()`` against the project's test Hub (``/api/validate-yaml``) in a client subprocess.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import transformers as T
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))  # the test Hub, for the one `hub` test
from hub_test_support import hf_home, hub_server, hub_server_factory, run, snippet  # noqa: E402, F401 - fixtures

from bitfit_hf import BitFitAdapter, BitFitConfig, apply_bitfit
from bitfit_hf.reporting.card_metadata import PIPELINE_TAGS, hub_base_model_id
from bitfit_hf.reporting.card_sections import BITFIT_CITATION
from bitfit_hf.reporting.eval_results import eval_rows
from bitfit_hf.reporting.heatmap import BiasChange, bias_change, classify, read_checkpoint_biases, snapshot_biases
from bitfit_hf.reporting.model_card import build_model_card, summary_from_adapter, template_path, write_model_card_files

REPO_ROOT = Path(__file__).resolve().parents[2]
ROLE_SHIFTS = {"b_q": 0.4, "b_k": 0.01, "b_v": 0.05, "b_m1": 0.02, "b_LN1": 0.03, "b_m2": 0.3, "b_m3": 0.04,
               "b_LN2": 0.06}


def tiny_bert(seed: int = 0, cls=T.BertForSequenceClassification, **kwargs):
    torch.manual_seed(seed)
    config = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                          intermediate_size=64, **kwargs)
    return cls(config).eval()


def shift_biases(model):
    """Move each trained bias by a known amount (alternating sign): its change is exactly that
    amount, ``ROLE_SHIFTS[role] * (layer + 1)`` (0.001 outside the layers)."""
    adapter = BitFitAdapter.from_model(model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, role, layer, _chunk in classify(adapter.config):
            step = ROLE_SHIFTS.get(role, 0.001) * ((1 + int(layer)) if layer else 1)
            sign = torch.ones_like(params[name])
            sign[::2] = -1
            params[name].add_(sign * step)


def test_bias_change_matrix_is_exact_sorted_and_round_trips(tmp_path):
    model = tiny_bert()
    apply_bitfit(model)
    base = snapshot_biases(model)
    shift_biases(model)
    change = bias_change(base, model)
    assert change.layers == ["0", "1", "2"]
    assert change.roles == ["b_q", "b_m2", "b_LN2", "b_v", "b_m3", "b_LN1", "b_m1", "b_k"], "rows sorted by total change"
    for role, shift in (("b_q", 0.4), ("b_m2", 0.3), ("b_k", 0.01), ("b_m1", 0.02)):
        for layer in range(3):
            assert change.value(role, layer) == pytest.approx(shift * (1 + layer), rel=1e-5)
        assert change.average[change.roles.index(role)] == pytest.approx(shift * 2, rel=1e-5)
    assert set(change.outside_layers) == {"b_emb_LN", "b_pooler"}
    assert change.outside_layers["b_pooler"] == pytest.approx(0.001, rel=1e-3)
    change.save(str(tmp_path / "bias_change.json"))
    again = BiasChange.load(str(tmp_path / "bias_change.json"))
    assert again.roles == change.roles and again.value("b_q", 2) == pytest.approx(1.2, rel=1e-5)
    table = change.to_markdown()
    assert table.splitlines()[0] == "| bias | 0 | 1 | 2 | avg |" and "| `b_q` | 0.4000 | 0.8000 | 1.2000 | 0.8000 |" in table


def test_bias_change_reads_only_biases_from_the_base_checkpoint(tmp_path):
    # A task model on a BertModel checkpoint: parameter names carry "bert." that the checkpoint lacks.
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    T.BertModel(config).save_pretrained(tmp_path / "encoder")
    model = T.BertForSequenceClassification.from_pretrained(tmp_path / "encoder", num_labels=2)
    state = apply_bitfit(model)
    base = snapshot_biases(model, state.selection.bias_parameter_names)
    shift_biases(model)
    adapter = BitFitAdapter.from_model(model, str(tmp_path / "encoder"))
    from_checkpoint = read_checkpoint_biases(str(tmp_path / "encoder"), list(base))
    assert set(from_checkpoint) == set(base)
    assert all(torch.equal(from_checkpoint[n], base[n]) for n in base)
    assert bias_change(str(tmp_path / "encoder"), adapter).to_dict() == bias_change(base, adapter).to_dict()
    # the summary rebuilt from the adapter and the checkpoint equals the trainer's
    assert summary_from_adapter(adapter) == model._bitfit_state.summary.to_dict()


def test_bias_change_added_biases_start_at_zero_and_fused_chunks_split():
    torch.manual_seed(0)
    llama = T.LlamaForSequenceClassification(T.LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
        vocab_size=100, pad_token_id=0, num_labels=2))
    apply_bitfit(llama, BitFitConfig(bias_terms=["b_q", "b_m2"], add_missing_biases=True))
    with torch.no_grad():
        for name, param in llama.named_parameters():
            if name.endswith(".bias"):
                param.fill_(0.25)
    change = bias_change({}, llama)  # nothing from the base: every bias was added, b0 = 0
    assert set(change.roles) == {"b_q", "b_m2"}
    assert all(v == pytest.approx(0.25) for row in change.values for v in row)

    gpt2 = T.GPT2ForSequenceClassification(T.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100,
                                                        pad_token_id=0, num_labels=2))
    apply_bitfit(gpt2, BitFitConfig(bias_terms="paper-subset"))
    base = snapshot_biases(gpt2)
    with torch.no_grad():
        for layer in gpt2.transformer.h:
            layer.attn.c_attn.bias[:32] += 0.5  # the b_q chunk of the fused q|k|v bias
            layer.mlp.c_fc.bias += 0.1
    adapter = BitFitAdapter.from_model(gpt2)
    assert {(role, chunk) for _, role, _, chunk in classify(adapter.config)} == {("b_q", (0, 3)), ("b_m2", None)}
    change = bias_change(base, adapter)
    assert change.roles == ["b_q", "b_m2"]
    assert change.value("b_q", 1) == pytest.approx(0.5) and change.value("b_m2", 0) == pytest.approx(0.1)


def test_heatmap_png_is_deterministic(tmp_path):
    pytest.importorskip("matplotlib")
    model = tiny_bert()
    apply_bitfit(model)
    base = snapshot_biases(model)
    shift_biases(model)
    change = bias_change(base, model)
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    change.plot(str(first))
    change.plot(str(second))
    data = first.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert data == second.read_bytes(), "the same matrix must give the same bytes (no commit on re-push)"


def card_for(task_cls=T.BertForSequenceClassification, **card_kwargs):
    model = tiny_bert(cls=task_cls, num_labels=3) if task_cls is not T.BertForMaskedLM else tiny_bert(cls=task_cls)
    state = apply_bitfit(model)
    base = snapshot_biases(model)
    shift_biases(model)
    adapter = BitFitAdapter.from_model(
        model, "google-bert/bert-base-uncased",
        metadata={"training_args": {"learning_rate": 1e-3, "num_train_epochs": 3, "seed": 42, "hub_token": "hf_SECRET"}})
    change = bias_change(base, adapter)
    card = build_model_card(adapter, "me/tiny-sst2-bitfit", summary=state.summary.to_dict(), bias_change=change,
                            heatmap_file="bias_change.png", **card_kwargs)
    return card, adapter


def test_card_metadata_and_body():
    card, adapter = card_for(
        eval_results={"eval_accuracy": 0.9125, "eval_f1": 0.9, "eval_loss": 0.31, "eval_runtime": 3.2, "epoch": 3.0,
                      "test_accuracy": 0.88, "train_loss": 0.4},
        dataset="nyu-mll/glue", dataset_name="GLUE SST-2", dataset_config="sst2", license="apache-2.0",
        language="en", tags=["sentiment"])
    text = str(card)
    meta = yaml.safe_load(text.split("---\n", 2)[1])
    assert meta["base_model"] == "google-bert/bert-base-uncased" and meta["base_model_relation"] == "adapter"
    assert meta["library_name"] == "bitfit-hf" and meta["tags"][0] == "bitfit" and "sentiment" in meta["tags"]
    assert meta["datasets"] == ["nyu-mll/glue"] and meta["license"] == "apache-2.0" and meta["language"] == "en"
    assert meta["pipeline_tag"] == "text-classification"
    results = card.data.eval_results
    got = {(r.dataset_split, r.metric_type): r.metric_value for r in results}
    assert got == {("validation", "accuracy"): 0.9125, ("validation", "f1"): 0.9, ("test", "accuracy"): 0.88}
    assert {r.dataset_type for r in results} == {"nyu-mll/glue"} and {r.dataset_config for r in results} == {"sst2"}
    assert {r.dataset_name for r in results} == {"GLUE SST-2"} and {r.task_type for r in results} == {"text-classification"}
    body = card.text
    for section in ("## What was trained", "## How to use", "## Training hyper-parameters", "## Evaluation",
                    "## How much each bias moved", "## Citation"):
        assert section in body, section
    assert "| `b_q` | attention query projection | 3 | 96 |" in body
    assert "AutoBitFitModel.from_pretrained(\"me/tiny-sst2-bitfit\")" in body
    assert "tokenizer = load_tokenizer(\"me/tiny-sst2-bitfit\")" in body  # the base's, found offline when packaged
    assert "num_labels=3" in body and "![Bias change per bias type and layer](bias_change.png)" in body
    assert "| validation | accuracy | 0.9125 |" in body and "| validation | loss | 0.3100 |" in body
    assert "runtime" not in body and "| learning_rate | 0.001 |" in body
    assert "hf_SECRET" not in text and "hub_token" not in text, "a token-like training argument leaked"
    assert BITFIT_CITATION in body and "acl-short.1" in body
    assert "Labels: `LABEL_0`, `LABEL_1`, `LABEL_2`." in body


@pytest.mark.parametrize("task_cls, tag", [
    (T.BertForTokenClassification, "token-classification"),
    (T.BertForQuestionAnswering, "question-answering"),
    (T.BertForMaskedLM, "fill-mask"),
])
def test_card_pipeline_tag_follows_the_task(task_cls, tag):
    card, adapter = card_for(task_cls)
    assert PIPELINE_TAGS[adapter.config.task_type] == tag
    assert card.data.pipeline_tag == tag
    assert card.data.eval_results is None and "## Evaluation" not in card.text


def test_base_model_ids_and_eval_rows(minilm_dir):
    from bitfit_hf.adapters.config import AdapterConfig

    def cfg(base):
        return AdapterConfig(base_model_name_or_path=base, model_type="bert", architecture="BertModel",
                             trained_parameters=[], adapter_parameters=[], base_fingerprint="x")

    assert hub_base_model_id(cfg(minilm_dir)) == "sentence-transformers/all-MiniLM-L6-v2"
    assert hub_base_model_id(cfg("/some/local/dir")) is None
    assert hub_base_model_id(cfg("bert-base-uncased")) == "bert-base-uncased"
    assert hub_base_model_id(cfg("/some/local/dir"), override="org/base") == "org/base"
    rows = eval_rows({"eval_exact_match": 80.5, "eval_f1": 88.1, "eval_samples": 100, "eval_steps_per_second": 3.0,
                      "predict_accuracy": 0.5, "train_runtime": 12.0})
    assert rows == [("validation", "exact_match", 80.5), ("validation", "f1", 88.1), ("test", "accuracy", 0.5)]
    assert eval_rows({"validation": {"accuracy": 0.7}}) == [("validation", "accuracy", 0.7)]


def test_card_files_written_and_template_shipped(tmp_path):
    path = Path(template_path())
    assert path.is_file() and path.resolve() == (REPO_ROOT / "model_cards" / "bitfit_adapter.md").resolve()
    # the wheel gets it as package data of bitfit_hf (model_cards/ reached through the symlink)
    assert (REPO_ROOT / "bitfit_hf" / "model_cards" / "bitfit_adapter.md").is_file()
    assert '"model_cards/*.md"' in (REPO_ROOT / "pyproject.toml").read_text()

    model = tiny_bert()
    state = apply_bitfit(model)
    base = snapshot_biases(model)
    shift_biases(model)
    adapter = BitFitAdapter.from_model(model, "google-bert/bert-base-uncased")
    adapter.save_pretrained(str(tmp_path))
    (tmp_path / "all_results.json").write_text(json.dumps({"eval_accuracy": 0.5, "epoch": 1.0}))
    (tmp_path / "trainable_summary.json").write_text(json.dumps(state.summary.to_dict()))
    written = write_model_card_files(str(tmp_path), adapter, "me/x", base=base)
    assert written == ["bias_change.json", "bias_change.png", "README.md"] or written == ["bias_change.json", "README.md"]
    readme = (tmp_path / "README.md").read_text()
    assert "- type: accuracy\n      value: 0.5" in readme, "all_results.json must reach the model-index"
    assert "`bias_change.json`" in readme and "`trainable_summary.json`" in readme
    # the card can be rebuilt later from the stored matrix alone
    os.remove(tmp_path / "README.md")
    assert "README.md" in write_model_card_files(str(tmp_path), adapter, "me/x")
    assert "![Bias change" in (tmp_path / "README.md").read_text()


def test_trainer_saves_the_bias_change_against_the_pretrained_biases(tmp_path):
    from datasets import Dataset

    from bitfit_hf import BitFitTrainer

    torch.manual_seed(0)
    model = tiny_bert()
    model.save_pretrained(tmp_path / "base")
    model = T.BertForSequenceClassification.from_pretrained(tmp_path / "base")
    ids = torch.randint(3, 100, (16, 8), generator=torch.Generator().manual_seed(0))
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": (ids[:, 0] % 2).tolist()})
    args = T.TrainingArguments(str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=8, learning_rate=1e-2,
                               report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    trainer = BitFitTrainer(model, args, train_dataset=data)
    trainer.train()
    trainer.save_model()
    saved = BiasChange.load(str(tmp_path / "out" / "bias_change.json"))
    adapter = BitFitAdapter.from_directory(str(tmp_path / "out"))
    assert saved.to_dict() == bias_change(str(tmp_path / "base"), adapter).to_dict()
    assert max(max(v for v in row if v is not None) for row in saved.values) > 0
    trainer.create_model_card(dataset="toy", license="mit")
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "library_name: bitfit-hf" in readme and (tmp_path / "out" / "bias_change.png").is_file()


VALIDATE = """
from huggingface_hub import ModelCard
card = ModelCard.load(README)
card.validate()
class Broken(ModelCard):
    def __str__(self):
        return "---\\nlicense: [unclosed\\n---\\n# x\\n"
bad = Broken("# x\\n")
result = {"broken": catch(bad.validate)}
"""


@pytest.mark.hub
def test_card_passes_modelcard_validate_on_the_test_hub(tmp_path, hub_server, hf_home):
    card, _ = card_for(eval_results={"eval_accuracy": 0.9}, dataset="nyu-mll/glue", license="apache-2.0")
    card.save(str(tmp_path / "README.md"))
    out = run(snippet(VALIDATE, README=str(tmp_path / "README.md")), hub_server, hf_home).value
    assert out["broken"] is not None and "ValueError" in out["broken"]["mro"], "validate() did not reach the server"
    assert hub_server.requests_to("POST", "/api/validate-yaml")


def test_card_shows_load_with_peft_exactly_when_the_peft_copy_is_there(tmp_path):
    """`bitfit-hf export-peft ADAPTER ADAPTER/peft` before a push: the card tells PEFT users how to load it."""
    from bitfit_hf.adapters.peft_export import export_peft

    base = tmp_path / "base"
    tiny_bert(num_labels=2).save_pretrained(base)
    model = T.BertForSequenceClassification.from_pretrained(base).eval()
    apply_bitfit(model)
    shift_biases(model)
    adapter = BitFitAdapter.from_model(model, str(base))
    adapter.save_pretrained(str(tmp_path / "adapter"))
    write_model_card_files(str(tmp_path / "adapter"), adapter, "me/x", heatmap=False)
    assert "Load with PEFT" not in (tmp_path / "adapter" / "README.md").read_text()
    export_peft(adapter, str(tmp_path / "adapter" / "peft"))
    write_model_card_files(str(tmp_path / "adapter"), adapter, "me/x", heatmap=False)
    readme = (tmp_path / "adapter" / "README.md").read_text()
    assert "### Load with PEFT" in readme
    assert 'PeftModel.from_pretrained(model, "me/x", subfolder="peft")' in readme
    assert "`peft/adapter_model.safetensors`" in readme


def test_card_of_a_pooled_adapter_says_what_the_head_reads():
    from bitfit_hf.utils.sentence_pooling import install_sentence_pooling

    model = install_sentence_pooling(tiny_bert(num_labels=2), "mean")
    state = apply_bitfit(model)
    adapter = BitFitAdapter.from_model(model, "sentence-transformers/all-MiniLM-L6-v2")
    card = build_model_card(adapter, "me/pooled", summary=state.summary.to_dict())
    assert "classifies from the base's own mean pooling" in card.text
    assert "b_pooler" not in card.text, "the removed pooler's bias is not among the trained roles"


def _trained(arch, config):
    """A tiny model prepared for ``config`` and its trained tensors moved: ``(state, adapter)``."""
    from conftest import tiny_model

    from bitfit_hf.tuners import apply_method

    model = tiny_model(arch)
    state = apply_method(model, config)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.01)
    return state, BitFitAdapter.from_model(model, "org/base")


def _configs():
    from bitfit_hf.tuners.adapterbias import AdapterBiasConfig
    from bitfit_hf.tuners.bitfit_ia3.config import BitFitIA3Config

    return [
        ("bert", BitFitConfig("one-d")), ("gpt2", BitFitConfig("one-d")), ("llama", BitFitConfig("one-d")),
        ("bert", BitFitConfig(["g_LN1", "g_LN2"])),
        ("bert", BitFitConfig(["b_q"], patterns=[r".*attention\.output\.LayerNorm\.weight"])),
        ("gpt2", BitFitConfig("paper-subset")), ("bert", AdapterBiasConfig()), ("bert", BitFitIA3Config("one-d")),
    ]


@pytest.mark.parametrize("arch, config", _configs(), ids=lambda v: v if isinstance(v, str) else
                         f"{v.method}-{'-'.join(getattr(v, 'bias_terms', []))}")
def test_the_summary_rebuilt_from_an_adapter_counts_every_trained_tensor_by_role(arch, config):
    """Norm gains, a method's own tensors and what patterns selected are counted as at training, not only biases."""
    state, adapter = _trained(arch, config)
    expected = state.summary.to_dict()
    expected.pop("notes", None)
    assert summary_from_adapter(adapter, total_params=state.summary.total_params) == expected


def test_the_one_d_card_counts_and_names_the_norm_gains():
    state, adapter = _trained("gpt2", BitFitConfig("one-d"))
    summary = summary_from_adapter(adapter, total_params=state.summary.total_params)
    assert {"g_LN1", "g_LN2", "g_final_LN"} <= set(summary["per_role"])
    gains = sum(n for role, n in summary["per_role"].items() if role.startswith("g_"))
    biases = sum(n for role, n in summary["per_role"].items() if role.startswith("b_"))
    assert gains == 5 * 32 and summary["bias_params"] == biases + gains  # 2 layers x 2 norms + ln_f, 32 wide
    text = build_model_card(adapter, "me/one-d", summary=summary).text
    assert "| `g_final_LN` | gain of the final LayerNorm of a pre-LN stack | 1 | 32 |" in text
    assert f"trains **{biases + gains:,} bias and gain parameters**" in text
    assert "only its bias terms and norm gains plus the task head" in text and "bias-only" not in text
    assert "| role | what it is |" in text and "`adapter_model.safetensors`: the trained tensors" in text


def test_a_bias_only_card_keeps_its_bias_wording():
    card, _ = card_for()
    text = card.text
    assert "BitFit (bias-only fine-tuning) freezes every weight matrix and LayerNorm gain" in text
    assert "| bias type | what it is |" in text and "**928 bias parameters**" in text
    assert "`adapter_model.safetensors`: the trained bias vectors and the task head" in text


def test_cards_state_bias_terms_where_the_method_has_them():
    from bitfit_hf.reporting.card_sections import selection_lines
    from bitfit_hf.tuners.adapterbias import AdapterBiasConfig
    from bitfit_hf.tuners.bitfit_ia3.config import BitFitIA3Config, IA3Config

    def first_lines(config):
        return selection_lines(_trained("bert", config)[1].config)[:2]

    assert first_lines(BitFitIA3Config("b_q")) == ["bias terms: `b_q`", "method settings: `ia3_feedforward_modules="
                                                   "None`, `ia3_target_modules=None`"]
    assert first_lines(IA3Config())[0].startswith("method settings:")  # (IA)³ alone: no bias term to state
    assert first_lines(AdapterBiasConfig())[0].startswith("method settings:")  # no bias selection at all
    assert first_lines(BitFitConfig("all"))[0] == "bias terms: `all`"


def test_the_bias_change_leaves_out_biases_the_base_lacks():
    """AdapterBias's L_alpha bias lives in a module it inserts: no base bias to compare it with."""
    from bitfit_hf.tuners.adapterbias import AdapterBiasConfig

    _, adapter = _trained("bert", AdapterBiasConfig())
    names = [entry[0] for entry in classify(adapter.config)]
    assert names and not any("alpha" in name for name in names)
    assert {role for _, role, _, _ in classify(adapter.config)} == {"b_LN2", "b_emb_LN"}
