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
