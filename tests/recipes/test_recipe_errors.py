"""Bad input to the recipes is a clear error before any training starts: unknown task, missing column,
labels outside the label set, empty split, a model without the needed head, a missing offline asset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from recipe_support import load_recipe

from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.recipe_kit.run import cli_entry


@pytest.fixture(autouse=True)
def no_training(monkeypatch):
    """Any of these runs reaching training is a failure of the input checks."""
    from bitfit_hf.hub.trainer import BitFitTrainer

    def refuse(*args, **kwargs):
        raise AssertionError("training started despite bad input")

    monkeypatch.setattr(BitFitTrainer, "train", refuse)
    monkeypatch.setattr(BitFitTrainer, "evaluate", refuse)


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def run(recipe: str, tmp_path: Path, *argv: str):
    return load_recipe(recipe).main(["--output_dir", str(tmp_path / "out"), *argv])


# --------------------------------------------------------------------------- glue


def test_glue_task_from_an_unreachable_hub(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import: patch, no retries
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(RecipeError, match=r"(?s)could not load the dataset 'nyu-mll/glue' \(rte\) from the Hub.*--train_file"):
        run("glue", tmp_path, "--task_name", "rte")


def test_glue_unknown_task(tmp_path):
    train = write(tmp_path / "train.csv", "sentence,label\ngood,1\nbad,0\n")
    with pytest.raises(RecipeError, match="unknown task 'sst3'; GLUE tasks: cola, sst2"):
        run("glue", tmp_path, "--task_name", "sst3", "--train_file", train, "--do_train")


def test_glue_missing_column(tmp_path):
    train = write(tmp_path / "train.csv", "text,label\ngood,1\nbad,0\n")
    with pytest.raises(RecipeError, match=r"no column 'sentence' \(task sst2 needs sentence\); its columns are: text, label"):
        run("glue", tmp_path, "--task_name", "sst2", "--train_file", train, "--do_train")


def test_glue_label_outside_the_label_set(tmp_path):
    train = write(tmp_path / "train.csv", "sentence,label\ngood,1\nbad,0\n")
    dev = write(tmp_path / "dev.csv", "sentence,label\nfine,1\nodd,2\n")
    with pytest.raises(RecipeError, match=r"'validation' split has 1 label\(s\) outside the label set \(row 1: 2\)"):
        run("glue", tmp_path, "--task_name", "sst2", "--train_file", train, "--validation_file", dev)


def test_glue_empty_split(tmp_path):
    train = write(tmp_path / "train.csv", "sentence,label\ngood,1\nbad,0\n")
    dev = write(tmp_path / "dev.csv", "sentence,label\n")
    with pytest.raises(RecipeError, match="holds no examples"):
        run("glue", tmp_path, "--train_file", train, "--validation_file", dev)


def test_glue_needs_a_validation_split_for_do_eval(tmp_path):
    train = write(tmp_path / "train.csv", "sentence,label\ngood,1\nbad,0\n")
    with pytest.raises(RecipeError, match="--do_eval needs a 'validation' split.*--validation_file"):
        run("glue", tmp_path, "--train_file", train, "--do_train", "--do_eval")


def test_model_without_the_needed_head(tmp_path):
    from transformers import CLIPVisionConfig

    model_dir = tmp_path / "vision"
    CLIPVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(model_dir)
    train = write(tmp_path / "train.csv", "sentence,label\ngood,1\nbad,0\n")
    with pytest.raises(RecipeError, match="'clip_vision_model' has no sequence classification head"):
        run("glue", tmp_path, "--train_file", train, "--do_train", "--model_name_or_path", str(model_dir))
    squad = write(tmp_path / "train.jsonl", json.dumps(
        {"id": "1", "question": "Who?", "context": "Ann did.", "answers": {"text": ["Ann"], "answer_start": [0]}}) + "\n")
    with pytest.raises(RecipeError, match="has no question answering head"):
        run("squad", tmp_path, "--train_file", squad, "--do_train", "--model_name_or_path", str(model_dir))


def test_conflicting_method_flags(tmp_path):
    with pytest.raises(RecipeError, match="applies to --method bitfit only"):
        run("glue", tmp_path, "--method", "frozen", "--bias_terms", "b_q")


# --------------------------------------------------------------------------- pos


def test_pos_tag_outside_the_label_set(tmp_path):
    train = write(tmp_path / "train.txt", "the/DET cat/NOUN\na/DET dog/NOUN\n")
    dev = write(tmp_path / "dev.txt", "cats/NOUN purr/VERB\n")
    with pytest.raises(RecipeError, match=r"'validation' split has tags outside the label set: 'VERB' \(1x\)"):
        run("pos", tmp_path, "--train_file", train, "--validation_file", dev)


def test_pos_missing_tag_column(tmp_path):
    train = write(tmp_path / "train.jsonl", json.dumps({"tokens": ["a", "b"], "ner": ["O", "O"]}) + "\n")
    with pytest.raises(RecipeError, match="no tag column .*its columns are: tokens, ner"):
        run("pos", tmp_path, "--train_file", train, "--do_train")
    with pytest.raises(RecipeError, match="no tag column 'upos'"):
        run("pos", tmp_path, "--train_file", train, "--do_train", "--label_column_name", "upos")


# --------------------------------------------------------------------------- squad


def test_squad_question_without_answer(tmp_path):
    rows = [{"id": "1", "question": "Who?", "context": "Ann did.", "answers": {"text": [], "answer_start": []}}]
    train = write(tmp_path / "train.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(RecipeError, match="without an answer.*SQuAD v1.1"):
        run("squad", tmp_path, "--train_file", train, "--do_train")


def test_squad_missing_column_and_bad_stride(tmp_path):
    rows = [{"id": "1", "question": "Who?", "passage": "Ann did.", "answers": {"text": ["Ann"], "answer_start": [0]}}]
    train = write(tmp_path / "train.jsonl", json.dumps(rows[0]) + "\n")
    with pytest.raises(RecipeError, match="no column 'context'"):
        run("squad", tmp_path, "--train_file", train, "--do_train")
    with pytest.raises(RecipeError, match="--doc_stride 300 must be"):
        run("squad", tmp_path, "--train_file", train, "--do_train", "--context_column_name", "passage",
            "--doc_stride", "300")


# --------------------------------------------------------------------------- CLI


def test_cli_prints_the_fetch_command_for_a_missing_asset(tmp_path, monkeypatch, capsys):
    from bitfit_hf.data.assets import status

    monkeypatch.setenv("BITFIT_HF_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(status, "installed_model", lambda spec: None)  # a fresh machine: no model wheel installed
    module = load_recipe("pos")
    with pytest.raises(SystemExit) as exit_info:
        cli_entry(lambda: module.main(["--output_dir", str(tmp_path / "out")]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    # the default model is missing too: one command fetches both
    assert "error:" in err and "bitfit-hf assets fetch minilm wsj_pos" in err, err
