"""The run's header line names what the run applies: ``--method`` when it trains, the adapter's own method when it
only evaluates or predicts with ``--adapter_name_or_path``."""

from __future__ import annotations

import logging

from conftest import tiny_model

from bitfit_hf import BitFitAdapter
from bitfit_hf.recipe_kit import DataArguments, RecipeDefaults, parse_recipe_args
from bitfit_hf.recipe_kit.run import log_run_header
from bitfit_hf.tuners import apply_method
from bitfit_hf.tuners.adapterbias import AdapterBiasConfig

DEFAULTS = RecipeDefaults(recipe="demo", offline_dataset="movie_reviews", offline_task="sst2")


def header(tmp_path, caplog, *argv) -> str:
    parsed = parse_recipe_args(DataArguments, DEFAULTS, [*argv, "--output_dir", str(tmp_path / "out")])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bitfit_hf"):
        log_run_header(parsed, "demo")
    return next(r.getMessage() for r in caplog.records if r.getMessage().startswith("method="))


def test_an_evaluation_only_run_logs_the_adapters_method(tmp_path, caplog):
    model = tiny_model("bert", num_labels=2)
    apply_method(model, AdapterBiasConfig())
    BitFitAdapter.from_model(model, "org/base").save_pretrained(str(tmp_path / "ab"))

    line = header(tmp_path, caplog, "--do_eval", "--adapter_name_or_path", str(tmp_path / "ab"))
    assert line.startswith("method=adapterbias selection=adapterbias (alpha_init_seed=0, ")
    line = header(tmp_path, caplog, "--do_predict", "--adapter_name_or_path", str(tmp_path / "ab"))
    assert line.startswith("method=adapterbias ")
    # training (on from it or afresh) applies --method
    assert header(tmp_path, caplog).startswith("method=bitfit selection=bitfit (all)")
