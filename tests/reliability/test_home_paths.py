"""``~`` is the home folder wherever a path is given: every path flag of the recipes (``--output_dir=~/runs/a``
is not expanded by the shell, nor is a value in a .json arguments file) and of the ``bitfit-hf`` verbs, so a run
never writes into a folder literally named ``~`` under the working directory nor reports a path as missing."""

from __future__ import annotations

import json
import os
import sys

import pytest
from reliability_support import REPO

from bitfit_hf.recipe_kit.args import parse_recipe_args

sys.path.insert(0, str(REPO / "tests" / "recipes"))
sys.path.insert(0, str(REPO / "tests" / "cli"))
from recipe_support import load_recipe  # noqa: E402


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def test_recipe_path_flags_expand_the_home_folder(home):
    glue = load_recipe("glue")
    parsed = parse_recipe_args(glue.GlueDataArguments, glue.DEFAULTS, [
        "--output_dir=~/runs/a", "--train_file=~/data/train.csv", "--validation_file", "~/data/dev.csv",
        "--model_name_or_path=~/models/minilm", "--tokenizer_name=~/models/tok", "--adapter_name_or_path=~/adapters/x",
        "--resume_from_checkpoint=~/runs/a/checkpoint-2", "--cache_dir=~/cache", "--validation_mismatched_file=~/mm.csv",
    ])
    assert parsed.training.output_dir == str(home / "runs" / "a")
    assert parsed.training.resume_from_checkpoint == str(home / "runs" / "a" / "checkpoint-2")
    assert parsed.data.train_file == str(home / "data" / "train.csv")
    assert parsed.data.validation_file == str(home / "data" / "dev.csv")
    assert parsed.data.validation_mismatched_file == str(home / "mm.csv")
    assert parsed.model.model_name_or_path == str(home / "models" / "minilm")
    assert parsed.model.tokenizer_name == str(home / "models" / "tok")
    assert parsed.model.adapter_name_or_path == str(home / "adapters" / "x")
    assert parsed.model.cache_dir == str(home / "cache")
    assert parse_recipe_args(glue.GlueDataArguments, glue.DEFAULTS, ["--model_name_or_path", "org/model"]).model.model_name_or_path == "org/model"


def test_an_arguments_file_expands_the_home_folder(home, tmp_path):
    glue = load_recipe("glue")
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"output_dir": "~/runs/b", "train_file": "~/data/train.csv", "do_train": True}))
    parsed = parse_recipe_args(glue.GlueDataArguments, glue.DEFAULTS, [str(args_file)])
    assert parsed.training.output_dir == str(home / "runs" / "b")
    assert parsed.data.train_file == str(home / "data" / "train.csv")


def test_cli_path_arguments_expand_the_home_folder(home, tmp_path, capsys):
    from test_predict_inputs import tiny_adapter

    from bitfit_hf.cli.main import main

    adapter = tiny_adapter(home / "tiny")
    (home / "in.txt").write_text("a good film\n")
    assert main(["predict", "~/tiny/adapter", "--file=~/in.txt"]) == 0
    assert "a good film" in capsys.readouterr().out
    assert main(["merge", "~/tiny/adapter", "~/merged", "--base-model=~/tiny/base"]) == 0
    assert (home / "merged" / "config.json").is_file() and not (tmp_path / "~").exists()
    assert main(["export-peft", adapter, "~/peft"]) == 0
    assert (home / "peft" / "adapter_config.json").is_file() and not (tmp_path / "~").exists()
    assert os.path.isdir(home / "tiny" / "adapter")
