"""LayerNorm tuning (``ln_tuning``): exactly every normalisation layer's gain and bias plus the head train, on any
architecture; the adapter reloads onto a stock base with the same logits, merges into a plain checkpoint and exports
as peft's own ``LNTuningConfig`` adapter; ``bitfit-hf info``, the summary rebuilt from the adapter and the model card
count the norms by their roles; the recipes parse ``--method ln_tuning``."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import peft
import pytest
import torch
import transformers as T
from conftest import batch, tiny_model
from safetensors.torch import load_file
from torch import nn

from bitfit_hf import (
    AdapterConfig,
    BaseModelMismatchError,
    BitFitAdapter,
    BitFitTrainer,
    export_peft,
    load_adapter,
    save_adapter,
)
from bitfit_hf.adapters.peft_export import peft_export_blocker
from bitfit_hf.cli.main import main as cli
from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.recipe_kit import args as recipe_args
from bitfit_hf.reporting.model_card import build_model_card, summary_from_adapter
from bitfit_hf.training.optim import parameter_groups
from bitfit_hf.tuners import METHODS, apply_method, describe_method, recipe_methods
from bitfit_hf.tuners.errors import SelectionError
from bitfit_hf.tuners.ln_tuning import LNTuningMethodConfig

try:
    from tests.support import adapter_roundtrip, tiny_training
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support import adapter_roundtrip, tiny_training  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]


def _is_norm(module: nn.Module) -> bool:
    """The test's own idea of a normalisation layer: a LayerNorm, or a class named ``*LayerNorm`` / ``*RMSNorm``."""
    return isinstance(module, nn.LayerNorm) or type(module).__name__.endswith(("LayerNorm", "RMSNorm"))


def _expected(model: nn.Module, heads) -> set:
    names = set()
    for module_name, module in model.named_modules():
        if module_name and _is_norm(module) and not any(module_name == h or module_name.startswith(h + ".") for h in heads):
            names |= {f"{module_name}.{attr}" for attr in ("weight", "bias")
                      if isinstance(getattr(module, attr, None), nn.Parameter)}
    for head in heads:
        names |= {f"{head}.{n}" for n, _ in model.get_submodule(head).named_parameters()}
    return names


def _logits(model, inputs=None):
    with torch.no_grad():
        return model(**(inputs or batch())).logits


# ---- what is trained -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["bert", "distilbert", "gpt2", "llama", "t5", "bart", "opt"])
def test_exactly_the_norms_and_the_head_are_trainable(arch):
    model = tiny_model(arch, num_labels=2)
    state = apply_method(model, LNTuningMethodConfig())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(state.selection.parameter_names) == _expected(model, state.selection.head_modules)
    roles = {e.role for e in state.selection.entries}
    assert "head" in roles and {"g_LN1", "g_LN2"} <= roles
    assert roles - {"head"} <= {"g_LN1", "g_LN2", "g_emb_LN", "g_final_LN", "g_xLN",
                                "b_LN1", "b_LN2", "b_emb_LN", "b_final_LN", "b_xLN"}
    if arch in ("llama", "t5"):  # RMSNorm-style norms: gains only
        assert not any(n.endswith(".bias") for n in trainable if "head" not in n and "score" not in n)


def test_roles_follow_the_role_tables_and_norms_no_role_names_are_gains():
    state = apply_method(tiny_model("bert", num_labels=2), LNTuningMethodConfig())
    by_name = {e.name: (e.role, e.layer) for e in state.selection.entries}
    assert by_name["bert.encoder.layer.1.attention.output.LayerNorm.weight"] == ("g_LN1", "1")
    assert by_name["bert.encoder.layer.0.output.LayerNorm.bias"] == ("b_LN2", "0")
    assert by_name["bert.embeddings.LayerNorm.weight"] == ("g_emb_LN", "")

    # Qwen3's per-head q_norm / k_norm: norms no role names, trained as "gain"
    config = T.Qwen3Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=64, vocab_size=100, pad_token_id=0, head_dim=16, num_labels=2)
    torch.manual_seed(0)
    qwen = T.AutoModelForSequenceClassification.from_config(config)
    state = apply_method(qwen, LNTuningMethodConfig())
    roles = {e.name: e.role for e in state.selection.entries}
    assert roles["model.layers.0.self_attn.q_norm.weight"] == "gain"
    assert roles["model.layers.1.input_layernorm.weight"] == "g_LN1" and roles["model.norm.weight"] == "g_final_LN"
    assert set(roles) == _expected(qwen, state.selection.head_modules)


def test_an_architecture_without_a_role_table_trains_its_norms_as_gains_and_biases():
    config = T.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             vocab_size=100, pad_token_id=0, num_labels=2)
    torch.manual_seed(0)
    model = T.AutoModelForSequenceClassification.from_config(config)
    state = apply_method(model, LNTuningMethodConfig())
    assert {e.role for e in state.selection.entries} == {"gain", "bias", "head"}
    assert set(state.selection.parameter_names) == _expected(model, state.selection.head_modules)


def test_no_head_and_no_norm():
    model = tiny_model("bert", num_labels=2)
    state = apply_method(model, LNTuningMethodConfig(train_head=False))
    assert not any(p.requires_grad for n, p in model.named_parameters() if n.startswith("classifier"))
    assert "head" not in state.summary.per_role
    with pytest.raises(SelectionError, match="no normalisation layer"):
        apply_method(nn.Sequential(nn.Linear(4, 4)), LNTuningMethodConfig())


def test_learning_rates_and_layerwise_decay_reach_the_optimizer_groups():
    model = tiny_model("bert", num_labels=2)
    state = apply_method(model, LNTuningMethodConfig(norm_learning_rate=4e-2, head_learning_rate=1e-2,
                                                     layerwise_lr_decay=0.5))
    groups = parameter_groups(model, state, 1e-3, 0.0, [])
    names = {id(p): n for n, p in model.named_parameters()}
    rate = {names[id(p)]: g["lr"] for g in groups for p in g["params"]}
    assert rate["classifier.weight"] == 1e-2
    assert rate["bert.encoder.layer.1.output.LayerNorm.weight"] == 4e-2  # the top layer
    assert rate["bert.encoder.layer.0.output.LayerNorm.bias"] == 2e-2  # one layer below
    assert rate["bert.embeddings.LayerNorm.weight"] == 1e-2  # below both layers
    assert set(rate) == set(state.selection.parameter_names)


def test_config_round_trip_and_bad_values():
    config = LNTuningMethodConfig(train_head=False, head_modules=["classifier"], norm_learning_rate=1e-3)
    assert LNTuningMethodConfig.from_dict(config.to_dict()) == config
    # an adapter hands back BitFit's selection fields, empty
    assert LNTuningMethodConfig.from_dict({**config.to_dict(), "bias_terms": [], "patterns": [],
                                           "add_missing_biases": False}) == config
    with pytest.raises(ValueError, match="no 'bias_terms' setting"):
        LNTuningMethodConfig.from_dict({"bias_terms": ["b_q"]})
    with pytest.raises(ValueError, match="Unknown LNTuningMethodConfig field"):
        LNTuningMethodConfig.from_dict({"lora_r": 8})
    for bad in (dict(norm_learning_rate=0), dict(head_learning_rate=float("nan")), dict(layerwise_lr_decay=1.5),
                dict(head_modules="classifier")):
        with pytest.raises(ValueError):
            LNTuningMethodConfig(**bad)
    assert config.learning_rate_for("head") is None and config.learning_rate_for("g_LN1") == 1e-3


# ---- training, saving, reloading, merging ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny BERT base saved, three BitFitTrainer steps of LN tuning on it, the adapter saved by the trainer."""
    tmp_path = tmp_path_factory.mktemp("ln_tuning")
    base_dir = tmp_path / "base"
    tiny_model("bert", num_labels=2).save_pretrained(base_dir)
    model = T.AutoModelForSequenceClassification.from_pretrained(base_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = BitFitTrainer(model, tiny_training.quiet_cpu_training_args(tmp_path), train_dataset=tiny_training.parity_dataset(100),
                            method_config=LNTuningMethodConfig())
    trainer.train()
    adapter_dir = tmp_path / "adapter"
    trainer.save_model(str(adapter_dir))
    model.eval()
    return dict(tmp=tmp_path, base=base_dir, adapter=adapter_dir, model=model, before=before,
                state=trainer.tuner_state, logits=_logits(model))


def test_training_moves_the_norms_and_head_and_leaves_every_other_parameter_bit_identical(trained):
    model, before = trained["model"], trained["before"]
    selected = set(trained["state"].selection.parameter_names)
    assert selected == _expected(model, ["classifier"])
    for name, param in model.named_parameters():
        if name in selected:
            assert not torch.equal(param, before[name]), f"{name} did not move"
        else:
            assert torch.equal(param, before[name]), f"{name} changed"


def test_the_adapter_reloads_onto_a_fresh_base_with_the_same_logits_and_merges(trained):
    adapter = BitFitAdapter.from_pretrained(str(trained["adapter"]))
    assert adapter.config.method == "ln_tuning" and adapter.config.bias_terms == []
    assert adapter.config.trained_parameters == trained["state"].selection.parameter_names
    assert set(adapter.tensors) == set(trained["state"].selection.parameter_names)

    fresh = T.AutoModelForSequenceClassification.from_pretrained(trained["base"])
    torch.manual_seed(3)
    fresh.classifier.reset_parameters()  # another random head: the adapter brings its own
    load_adapter(fresh, str(trained["adapter"]))
    assert torch.equal(_logits(fresh.eval()), trained["logits"])

    adapter_roundtrip.assert_reloads_exactly_and_merges(trained["adapter"], trained["base"], trained["tmp"] / "merged", batch(),
                                      trained["logits"], method_marker="ln_tuning", merge_atol=0.0)
    assert not METHODS["ln_tuning"].supports("merge")  # the model's own state dict is the plain checkpoint


def test_a_reload_onto_another_base_is_refused(trained):
    """The fingerprint covers the frozen weights only: another base with the same shapes is refused."""
    other = tiny_model("bert", num_labels=2, seed=5)
    with pytest.raises(BaseModelMismatchError):
        load_adapter(other, str(trained["adapter"]))


def test_info_summary_and_card_count_the_norm_gains(trained, capsys):
    adapter = BitFitAdapter.from_pretrained(str(trained["adapter"]))
    training_summary = trained["state"].summary.to_dict()
    rebuilt = summary_from_adapter(adapter, total_params=training_summary["total_params"])
    assert rebuilt["per_role"] == training_summary["per_role"]  # the heat map's roles are the training roles
    assert rebuilt["per_role_layer"] == training_summary["per_role_layer"]
    assert training_summary["per_role"]["g_LN1"] == training_summary["per_role"]["b_LN1"] == 2 * 32

    assert cli(["info", str(trained["adapter"])]) == 0
    rows = {line[:14].strip(): line[14:] for line in capsys.readouterr().out.splitlines()}
    assert rows["method"] == "ln_tuning (every normalisation layer's gain and bias)"
    assert set(rows["trained roles"].split()) == {"b_LN1", "b_LN2", "b_emb_LN", "g_LN1", "g_LN2", "g_emb_LN", "+",
                                                  "head"}
    outside_head = sum(v for k, v in training_summary["per_role"].items() if k != "head")
    assert f"{outside_head:,} outside the head" in rows["parameters"]

    card = build_model_card(adapter, "me/tiny-ln").content
    assert "**LN tuning** adapter" in card and "normalisation layer" in card
    assert "Tuning LayerNorm in Attention" in card and "@inproceedings{zhao2024tuning" in card
    assert "g_LN1" in card and describe_method(adapter.config) == rows["method"]


# ---- PEFT export --------------------------------------------------------------------------------------------------


def _perturbed(tmp_path, arch):
    """A stock tiny model saved as the base, and a copy with its norms and head perturbed, saved as an adapter."""
    base_dir = tmp_path / "base"
    tiny_model(arch, num_labels=2).save_pretrained(base_dir)
    model = T.AutoModelForSequenceClassification.from_pretrained(base_dir).eval()
    state = apply_method(model, LNTuningMethodConfig())
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn(param.shape, generator=g))
    save_adapter(model, str(tmp_path / "adapter"))
    return base_dir, _logits(model), state


@pytest.mark.filterwarnings("ignore:Unsupported layer type:UserWarning")  # peft's loader, about its own LN layer
@pytest.mark.parametrize("arch", ["bert", "llama", "gpt2"])
def test_the_peft_export_is_an_ln_tuning_adapter_with_the_same_logits(arch, tmp_path):
    base_dir, expected, state = _perturbed(tmp_path, arch)
    adapter = BitFitAdapter.from_pretrained(str(tmp_path / "adapter"))
    assert peft_export_blocker(adapter) is None
    export_peft(adapter, str(tmp_path / "peft"))

    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    norms = {n.rpartition(".")[0] for e in state.selection.entries if e.role != "head" for n in [e.name]}
    assert config["peft_type"] == "LN_TUNING" and config["task_type"] == "SEQ_CLS"
    assert set(config["target_modules"]) == norms
    assert set(config["modules_to_save"]) >= set(state.selection.head_modules)
    assert config["base_model_name_or_path"] == str(base_dir)
    stored = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
    assert sum(".ln_tuning_layers." in n for n in stored) == len(state.selection.bias_parameter_names)

    stock = T.AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=2)
    loaded = peft.PeftModel.from_pretrained(stock, str(tmp_path / "peft")).eval()
    torch.testing.assert_close(_logits(loaded), expected, atol=1e-5, rtol=0)


# ---- the recipes --------------------------------------------------------------------------------------------------


def _parse(tmp_path, *argv):
    return recipe_args.parse_recipe_args(recipe_args.DataArguments, recipe_args.RecipeDefaults(
        recipe="demo", offline_dataset="movie_reviews"), ["--output_dir", str(tmp_path / "run"), *argv])


def test_the_recipes_offer_method_ln_tuning(tmp_path):
    assert "ln_tuning" in recipe_args.METHODS and "ln_tuning" in recipe_methods()
    method_field = next(f for f in dataclasses.fields(recipe_args.BitFitArguments) if f.name == "method")
    assert "ln_tuning" in method_field.metadata["choices"] and "ln_tuning: LayerNorm tuning" in method_field.metadata["help"]
    parsed = _parse(tmp_path, "--method", "ln_tuning")
    assert parsed.training.learning_rate == recipe_args.DEFAULT_LEARNING_RATES["ln_tuning"] == 1e-3
    assert parsed.bitfit.method_config() == LNTuningMethodConfig()
    parsed = _parse(tmp_path, "--method", "ln_tuning", "--no_train_head", "--head_learning_rate", "1e-2",
                    "--layerwise_lr_decay", "0.9", "--learning_rate", "2e-3")
    assert parsed.training.learning_rate == 2e-3
    assert parsed.bitfit.method_config() == LNTuningMethodConfig(train_head=False, head_learning_rate=1e-2,
                                                                 layerwise_lr_decay=0.9)


@pytest.mark.parametrize("argv, message", [
    (["--bias_terms", "b_q"], r"--bias_terms select or tune BitFit's biases; --method ln_tuning"),
    (["--bias_patterns", ".*query.*"], "--bias_patterns"),
    (["--add_missing_biases"], "--add_missing_biases"),
    (["--bias_learning_rate", "1e-2"], "--bias_learning_rate"),
    (["--lora_r", "4"], "--lora_"),
    (["--share_alpha"], "--share_alpha applies to --method adapterbias only"),
    (["--head_learning_rate", "0"], "head_learning_rate must be a positive number"),
])
def test_flags_it_does_not_take_are_refused(tmp_path, argv, message):
    with pytest.raises(RecipeError, match=message):
        _parse(tmp_path, "--method", "ln_tuning", *argv).bitfit.method_config()


def test_an_adapter_config_rebuilds_the_method_config(trained):
    cfg = AdapterConfig.from_json((trained["adapter"] / "adapter_config.json").read_text())
    assert cfg.method_config == {} and cfg.tuner_config() == LNTuningMethodConfig(head_modules=["classifier"])


@pytest.mark.slow  # the real all-MiniLM-L6-v2, two steps of the GLUE recipe
def test_the_glue_recipe_trains_and_saves_an_ln_tuning_adapter(tmp_path):
    spec = importlib.util.spec_from_file_location("bitfit_recipe_glue_ln", ROOT / "recipes" / "glue.py")
    glue = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(glue)
    out = tmp_path / "run"
    glue.main(["--output_dir", str(out), "--method", "ln_tuning", "--max_train_samples", "32", "--max_eval_samples",
               "32", "--max_steps", "2", "--per_device_train_batch_size", "16", "--save_strategy", "no",
               "--disable_tqdm", "True"])
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["method"] == "ln_tuning"
    per_role = json.loads((out / "trainable_summary.json").read_text())["per_role"]
    assert {"g_LN1", "b_LN1", "g_LN2", "b_LN2", "g_emb_LN", "b_emb_LN", "head"} <= set(per_role)
    assert per_role["g_LN1"] == 6 * 384  # all-MiniLM-L6-v2: 6 layers, hidden size 384
