"""train_cost.py's rows are the recipes' ``--method`` names: every registered method (one registered later too) is a
row built as the recipes build it, the benchmark's old names still mean what they measured, and the report code reads
the committed results files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cost(monkeypatch):
    """The support modules, imported as the scripts import them (benchmarks/ on the path)."""
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("cost_methods"), importlib.import_module("cost_report")


def _recipes_config(method: str):
    """The config ``python recipes/glue.py --method METHOD`` trains with its default flags."""
    from bitfit_hf.recipe_kit.args import BitFitArguments

    arguments = BitFitArguments(method=method)
    return (getattr(arguments, "method_config", None) or arguments.bitfit_config)()


def test_every_recipe_method_is_a_row_with_the_recipes_config(cost):
    methods, _ = cost
    from bitfit_hf.tuners import recipe_methods

    for name in recipe_methods():
        row = methods.parse_row(name)
        assert row.name == name
        if name in methods.REFERENCES:  # trained without bitfit-hf, as the baselines
            continue
        assert methods.method_config(name) == _recipes_config(name), name


def test_a_method_registered_later_is_a_row_with_no_change(cost, monkeypatch):
    methods, _ = cost
    import bitfit_hf.tuners as tuners
    from bitfit_hf import BitFitConfig
    from bitfit_hf.tuners.recipe import RecipeMethod

    known = tuners.recipe_methods()
    toy = RecipeMethod("toy", lambda common, own: BitFitConfig(bias_terms=common.bias_terms or "all"), bias_terms=True)
    monkeypatch.setattr(tuners, "recipe_methods", lambda: {**known, "toy": toy})
    row = methods.parse_row("toy:bias_terms=b_q b_v")
    assert (row.method, row.reference) == ("toy", False)
    assert methods.method_config(row.method, row.flags) == BitFitConfig(bias_terms=["b_q", "b_v"])
    assert "toy" in methods.names_help()
    assert methods.label(row.name) == "`--method toy --bias_terms b_q b_v` (BitFitTrainer)"


def test_old_names_are_the_same_configurations(cost):
    methods, _ = cost
    from bitfit_hf import BitFitConfig
    from bitfit_hf.tuners.bitfit_ia3 import BitFitIA3Config
    from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig

    def config(name):
        row = methods.parse_row(name)
        return methods.method_config(row.method, row.flags)

    assert config("bitfit-all") == BitFitConfig(bias_terms="all")
    assert config("bitfit-paper") == BitFitConfig(bias_terms="paper-subset")
    assert config("bitfit-lora") == BitFitLoraConfig(bias_terms="all", lora_r=8, lora_alpha=16, lora_dropout=0.1)
    assert config("bitfit-ia3") == BitFitIA3Config(bias_terms="all")
    assert methods.parse_row("bitfit-all@frozen-bf16").name == "bitfit@frozen-bf16"
    assert methods.parse_row("bitfit-all-fused").options == ("adamw-fused",)
    assert methods.parse_row("plain-bitfit-all") == methods.parse_row("plain-bitfit")
    notes = methods.alias_notes(["full", "bitfit-paper"])
    assert notes == ["note: bitfit-paper is the row bitfit:bias_terms=paper-subset (the recipes' --method bitfit "
                     "--bias_terms paper-subset); results are keyed by that name"]


def test_common_defaults_are_the_recipes(cost):
    methods, _ = cost
    from bitfit_hf.recipe_kit.method_args import MethodArguments

    names = {"bias_patterns": "patterns"}
    recipes = {names.get(f.name, f.name): f.default for f in dataclasses.fields(MethodArguments) if f.name != "method"}
    assert {k: (v or None) if isinstance(v, list) else v for k, v in methods.COMMON_DEFAULTS.items()} == recipes


@pytest.mark.parametrize("name", ["nope", "lora:lora_r=4", "bitfit@fast", "bitfit:no_such_flag=1", "plain-beft"])
def test_unknown_rows_are_refused(cost, name):
    methods, _ = cost
    with pytest.raises(ValueError):
        row = methods.parse_row(name)
        methods.check_row(row, "fp32")


def test_committed_results_still_read(cost):
    """Results files keep their layout and old row names: the table and the target lines come back from them."""
    _, report = cost
    text = (ROOT / "benchmarks" / "results" / "minilm.md").read_text()
    result = json.loads((ROOT / "benchmarks" / "results" / "minilm.json").read_text())["models"]["minilm"]
    table = report.markdown_table("minilm", result["rows"], result["batch"], result["seq"])
    assert table.count("\n| ") == 2 + len(result["rows"]) and "full fine-tuning (Trainer)" in table
    assert "`--method bitfit --bias_terms paper-subset` (BitFitTrainer)" in table
    lines = report.target_lines("minilm", result["rows"])
    assert len(lines) == 3 and all(line in text for line in lines)
