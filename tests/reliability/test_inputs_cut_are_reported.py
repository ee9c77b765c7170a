"""The recipes never change their training data silently: examples cut at ``--max_seq_length`` (glue) or
``--block_size`` (clm without packing, instruction data) are counted and reported in a warning, and instruction
data whose prompts leave no room for any response token (nothing to learn: every label -100) is refused."""

from __future__ import annotations

import logging
import sys

import pytest
import transformers as T
from datasets import Dataset
from reliability_support import REPO

from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.recipe_kit.data import report_cut

sys.path.insert(0, str(REPO / "tests" / "recipes"))
from recipe_support import load_recipe  # noqa: E402

WORDS = "the a cat dog sat ran film good bad long dull and is was on mat".split()


@pytest.fixture()
def tokenizer(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return T.BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True)


def test_glue_counts_the_examples_cut_at_max_seq_length(tokenizer, caplog):
    from bitfit_hf.recipe_kit.tasks.classification import make_tokenize_function

    data = Dataset.from_dict({"sentence": ["a good film", " ".join(["good"] * 20), "bad"], "label": [1, 1, 0]})
    features = data.map(make_tokenize_function(tokenizer, "sentence", None, 8, False), batched=True)
    assert features["cut"] == [False, True, False]
    with caplog.at_level(logging.WARNING):
        features = report_cut(features, "train", "--max_seq_length 8")
    assert "cut" not in features.column_names
    assert "1 of 3 examples of the train split were cut at --max_seq_length 8" in caplog.text


def test_clm_without_packing_counts_the_texts_cut(tokenizer, caplog):
    clm = load_recipe("clm")
    data = Dataset.from_dict({"text": ["a good film", " ".join(["good"] * 20)]})
    features = data.map(clm.make_text_examples(tokenizer, "text", 8, packing=False), batched=True,
                        remove_columns=["text"])
    with caplog.at_level(logging.WARNING):
        report_cut(features, "train", "--block_size 8")
    assert "1 of 2 examples of the train split were cut at --block_size 8" in caplog.text


def test_clm_instruction_data_reports_cut_responses_and_refuses_examples_with_nothing_to_learn(tokenizer, caplog):
    clm = load_recipe("clm")
    long_prompt = " ".join(["the cat sat on the mat"] * 3)
    data = Dataset.from_dict({"p": ["the cat", long_prompt, "a dog"], "r": ["sat on the mat and ran", "ran", "ran"]})
    features = data.map(clm.make_instruction_examples(tokenizer, "p", "r", 8, False), batched=True,
                        remove_columns=["p", "r"])
    assert features["cut"] == [True, True, False] and features["no_target"] == [False, True, False]
    with caplog.at_level(logging.WARNING):
        kept = report_cut(features, "train", "--block_size 8")
    assert "2 of 3 examples of the train split were cut at --block_size 8" in caplog.text
    assert "1 of them kept no response token (it trains nothing)" in caplog.text
    assert not {"cut", "no_target"} & set(kept.column_names)
    hopeless = data.select([1]).map(clm.make_instruction_examples(tokenizer, "p", "r", 8, False), batched=True,
                                    remove_columns=["p", "r"])
    with pytest.raises(RecipeError, match=r"none of the 1 examples of the train split keeps a response token within "
                                          r"--block_size 8"):
        report_cut(hopeless, "train", "--block_size 8")
