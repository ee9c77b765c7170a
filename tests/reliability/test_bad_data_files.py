"""Bad data files give an error that names the offending file and line: a word/TAG file with a token
lacking its /TAG in the first lines is not misread as CoNLL columns (which blamed the label set)."""

from __future__ import annotations

import pytest

from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.recipe_kit.tasks.tagging import read_tagging_native

TAGGED = "The/DT cat/NN sat/VBD on/IN the/DT mat/NN ./.\n"


def test_a_token_without_its_tag_in_the_first_lines_names_the_line(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(TAGGED + "Dogs/NNS bark loudly/RB ./.\n" + TAGGED * 3)
    with pytest.raises(RecipeError, match=r"train\.txt:2: token 'bark' is not of the form word/TAG"):
        read_tagging_native(str(path))


def test_the_very_first_token_without_a_tag(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("The cat/NN sat/VBD ./.\n" + TAGGED)
    with pytest.raises(RecipeError, match=r"train\.txt:1: token 'The' is not of the form word/TAG"):
        read_tagging_native(str(path))


def test_conll_columns_are_still_read_as_conll(tmp_path):
    path = tmp_path / "train.conll"
    path.write_text("The DT\n1/2 CD\ncats NNS\n\nDogs NNS\nbark VBP\n")
    data = read_tagging_native(str(path))
    assert data["tokens"] == [["The", "1/2", "cats"], ["Dogs", "bark"]]
    assert data["pos_tags"] == [["DT", "CD", "NNS"], ["NNS", "VBP"]]


def test_the_pos_recipe_reports_the_line(tmp_path, capsys):
    import sys

    from reliability_support import REPO

    sys.path.insert(0, str(REPO / "tests" / "recipes"))
    from recipe_support import load_recipe

    from bitfit_hf.recipe_kit.run import cli_entry

    path = tmp_path / "train.txt"
    path.write_text(TAGGED + "Dogs/NNS bark loudly/RB ./.\n")
    main = load_recipe("pos").main
    with pytest.raises(SystemExit) as exit_info:
        cli_entry(lambda: main(["--output_dir", str(tmp_path / "out"), "--train_file", str(path), "--do_train"]))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert "train.txt:2: token 'bark' is not of the form word/TAG" in err


# ---- files datasets cannot read, and rows a recipe cannot use: file and line (or byte) named, before any model

def run_recipe_error(capsys, monkeypatch, recipe: str, out, *argv: str) -> str:
    """``recipes/<recipe>.py ARGV`` through its command-line entry; loading a model is a test failure (the data
    must be checked first). Returns the one ``error:`` line (exit 2, no traceback)."""
    import sys

    from reliability_support import REPO

    sys.path.insert(0, str(REPO / "tests" / "recipes"))
    from recipe_support import load_recipe

    from bitfit_hf.recipe_kit import loading
    from bitfit_hf.recipe_kit import run as recipe_run

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(loading, "load_tokenizer", no_loading)
    monkeypatch.setattr(loading, "load_model", no_loading)
    main = load_recipe(recipe).main
    with pytest.raises(SystemExit) as exit_info:
        recipe_run.cli_entry(lambda: main(["--output_dir", str(out), "--do_train", *argv]))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def test_clm_names_the_line_without_the_text_field(capsys, monkeypatch, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "The first editorial."}\n\n{"title": "no text here"}\n{"text": "more"}\n')
    line = run_recipe_error(capsys, monkeypatch, "clm", tmp_path / "out", "--train_file", str(path))
    assert line.endswith(f"error: {path}:3: no 'text' field (--text_column_name text).")
    assert not (tmp_path / "out").exists()


def test_clm_names_the_line_whose_text_is_null(capsys, monkeypatch, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "The first editorial."}\n{"text": null}\n')
    line = run_recipe_error(capsys, monkeypatch, "clm", tmp_path / "out", "--train_file", str(path))
    assert line.endswith(f"error: {path}:2: 'text' is null, not a text (--text_column_name text).")
    assert not (tmp_path / "out").exists()


def test_clm_instruction_data_names_the_line_and_the_column(capsys, monkeypatch, tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text('{"instruction": "Hi", "output": "Hello"}\n{"instruction": "Bye", "output": null}\n')
    line = run_recipe_error(capsys, monkeypatch, "clm", tmp_path / "out", "--train_file", str(path),
                            "--prompt_column", "instruction", "--response_column", "output")
    assert line.endswith(f"error: {path}:2: 'output' is null, not a text (--response_column output).")


def test_a_csv_that_is_not_utf8_names_the_line_and_byte(capsys, monkeypatch, tmp_path):
    path = tmp_path / "train.csv"
    path.write_bytes(b"sentence,label\ngood,1\ncaf\xe9 au lait,0\n")
    line = run_recipe_error(capsys, monkeypatch, "glue", tmp_path / "out", "--train_file", str(path))
    assert f"--train_file {str(path)!r} is not UTF-8 text: line 3 (byte 25 of the file is 0xe9)" in line
    assert "An error occurred while generating the dataset" not in line


def test_an_unparsable_jsonl_line_is_named(capsys, monkeypatch, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "fine", \n{"text": "more"}\n')
    line = run_recipe_error(capsys, monkeypatch, "clm", tmp_path / "out", "--train_file", str(path))
    assert f"error: {path}:2: not valid JSON (" in line
    assert "An error occurred while generating the dataset" not in line


def test_a_broken_json_array_is_named_by_line_and_column(tmp_path):
    from bitfit_hf.recipe_kit.data import load_data_file

    path = tmp_path / "dev.json"
    path.write_text('[\n  {"sentence": "a", "label": 1},\n  {"sentence": "b" "label": 0}\n]\n')
    with pytest.raises(RecipeError, match=rf"{path}:3: not valid JSON \(Expecting ',' delimiter, column 20\)"):
        load_data_file(str(path), "validation")


def test_glue_names_the_row_of_an_empty_text_cell(capsys, monkeypatch, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"sentence": "good", "label": 1}\n{"sentence": null, "label": 0}\n')
    line = run_recipe_error(capsys, monkeypatch, "glue", tmp_path / "out", "--train_file", str(path))
    assert line.endswith(f"error: {path}:2: 'sentence' is null, not a text.")
