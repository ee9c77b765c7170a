"""Every recipe watches its training for a collapse: a rate that collapses a tiny random model is
reported while the run trains, within its first epoch, with what to try; a healthy rate is not. Tiny word-level
checkpoints and generated data keep each run to seconds."""

from __future__ import annotations

import json
import logging
import math
import random

import pytest
import torch
import transformers as T
from recipe_support import few_threads, load_recipe, save_tiny_bert, save_word_tokenizer  # noqa: F401 - few_threads: autouse

pytestmark = pytest.mark.slow  # end to end, as the other recipe runs (about 20 s each on 2 cores)

POSITIVE = "good great fun fine nice bright".split()
NEGATIVE = "bad boring dull awful poor grim".split()
OTHER = "the a film movie was is it this and not".split()
VOCAB = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + POSITIVE + NEGATIVE + OTHER)}
COLLAPSE_LOGGER = "bitfit_hf.training.collapse"
# 128 training rows in batches of 8: 16 steps an epoch, 3 epochs, the loss logged every 4 steps
SHORT = ["--per_device_train_batch_size", "8", "--num_train_epochs", "3", "--logging_steps", "4", "--save_strategy", "no",
         "--disable_tqdm", "True", "--eval_before_training", "false", "--do_train", "--do_eval", "--method", "full",
         "--seed", "0", "--max_eval_samples", "8"]
STEPS_PER_EPOCH = 16


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A random 2-layer BERT with a word-level tokenizer, saved as a checkpoint (every encoder head loads on it)."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), VOCAB)


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_gpt2")
    save_word_tokenizer(folder, VOCAB, eos_token="[SEP]", bos_token="[CLS]")
    torch.manual_seed(0)
    T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=len(VOCAB), n_positions=64,
                                   bos_token_id=2, eos_token_id=3, pad_token_id=0)).save_pretrained(folder)
    return str(folder)


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _sentences(n, seed):
    """Six words, all positive (label 1) or all negative (label 0), among filler words: every word tells."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randint(0, 1)
        pool = POSITIVE if label else NEGATIVE
        rows.append({"sentence": " ".join(rng.choice(pool + OTHER[:2]) for _ in range(6)), "label": label})
    return rows


def _run(recipe_name, argv, caplog):
    """Run the recipe in process; the collapse callback it trained with and the warnings that callback logged."""
    recipe = load_recipe(recipe_name)
    seen = {}
    trainer_class = recipe.QuestionAnsweringTrainer if recipe_name == "squad" else recipe.BitFitTrainer

    class Capturing(trainer_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["trainer"] = self

    setattr(recipe, trainer_class.__name__, Capturing)
    with caplog.at_level(logging.INFO, logger=COLLAPSE_LOGGER):
        recipe.main(argv)
    [callback] = [c for c in seen["trainer"].callback_handler.callbacks if type(c).__name__ == "CollapseCallback"]
    warnings = [r.getMessage() for r in caplog.records if r.name == COLLAPSE_LOGGER and r.levelno == logging.WARNING]
    return callback, warnings


def _glue_files(tmp_path):
    return ["--train_file", _write_jsonl(tmp_path / "train.jsonl", _sentences(128, 0)),
            "--validation_file", _write_jsonl(tmp_path / "dev.jsonl", _sentences(16, 1))]


def test_glue_collapse_is_reported_in_the_first_epoch(tmp_path, tiny_bert, caplog):
    callback, warnings = _run("glue", ["--model_name_or_path", tiny_bert, "--output_dir", str(tmp_path / "out"),
                                       *_glue_files(tmp_path), *SHORT, "--learning_rate", "0.1"], caplog)
    # the level the recipe computed: the entropy of the 128 training labels (about ln 2)
    assert callback.constant_loss.value == pytest.approx(math.log(2), abs=0.01)
    assert "entropy of the training labels" in callback.constant_loss.source
    assert callback.report is not None and callback.report.kind == "constant"
    assert callback.report.step <= STEPS_PER_EPOCH
    [message] = warnings
    assert "Training has stopped learning" in message and "--learning_rate than this run's 0.1" in message


def test_glue_healthy_run_is_not_reported(tmp_path, tiny_bert, caplog):
    callback, warnings = _run("glue", ["--model_name_or_path", tiny_bert, "--output_dir", str(tmp_path / "out"),
                                       *_glue_files(tmp_path), *SHORT, "--learning_rate", "1e-2"], caplog)
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert results["eval_accuracy"] == 1.0, "the healthy run must learn for this test to mean anything"
    assert callback.report is None and warnings == []


def test_pos_collapse_is_reported_in_the_first_epoch(tmp_path, tiny_bert, caplog):
    tags = {**{w: "ADJ" for w in POSITIVE + NEGATIVE}, "the": "DET", "a": "DET", "film": "NOUN", "movie": "NOUN",
            "was": "VERB", "is": "VERB", "it": "PRON", "this": "DET", "and": "CONJ", "not": "ADV"}
    rng = random.Random(0)
    words = list(tags)

    def lines(n):
        return "".join(" ".join(f"{w}/{tags[w]}" for w in rng.sample(words, 6)) + "\n" for _ in range(n))

    (tmp_path / "train.pos").write_text(lines(128))
    (tmp_path / "dev.pos").write_text(lines(8))
    callback, warnings = _run("pos", ["--model_name_or_path", tiny_bert, "--output_dir", str(tmp_path / "out"),
                                      "--train_file", str(tmp_path / "train.pos"), "--validation_file",
                                      str(tmp_path / "dev.pos"), *SHORT, "--learning_rate", "1.0"], caplog)
    assert "entropy of the training tags" in callback.constant_loss.source and callback.constant_loss.value > 1.0
    assert callback.report is not None and callback.report.step <= STEPS_PER_EPOCH, callback.report
    assert len(warnings) == 1


def test_squad_collapse_is_reported_in_the_first_epoch(tmp_path, tiny_bert, caplog):
    rng = random.Random(0)

    def rows(n, offset):
        out = []
        for i in range(n):
            before, after = rng.randint(1, 10), rng.randint(1, 4)  # the answer's position varies
            context = " ".join(rng.choice(OTHER) for _ in range(before)) + " good " + " ".join(
                rng.choice(OTHER) for _ in range(after))
            start = context.index(" good ") + 1
            out.append({"id": str(offset + i), "question": "is it good", "context": context,
                        "answers": {"text": ["good"], "answer_start": [start]}})
        return out

    callback, warnings = _run("squad", ["--model_name_or_path", tiny_bert, "--output_dir", str(tmp_path / "out"),
                                        "--train_file", _write_jsonl(tmp_path / "train.jsonl", rows(128, 0)),
                                        "--validation_file", _write_jsonl(tmp_path / "dev.jsonl", rows(8, 1000)),
                                        "--max_seq_length", "32", "--doc_stride", "8", *SHORT,
                                        "--learning_rate", "1.0"], caplog)
    # ten answer positions about equally often: the best input-blind prediction's loss is near ln 10
    assert "answer positions" in callback.constant_loss.source and callback.constant_loss.value == pytest.approx(math.log(10), abs=0.2)
    assert callback.report is not None and callback.report.step <= STEPS_PER_EPOCH, callback.report
    assert len(warnings) == 1


def test_clm_collapse_is_reported_in_the_first_epoch(tmp_path, tiny_gpt2, caplog):
    rng = random.Random(0)
    words = POSITIVE + NEGATIVE + OTHER
    texts = [{"text": " ".join(rng.choice(words) for _ in range(15))} for _ in range(128)]
    callback, warnings = _run("clm", ["--model_name_or_path", tiny_gpt2, "--output_dir", str(tmp_path / "out"),
                                      "--train_file", _write_jsonl(tmp_path / "train.jsonl", texts),
                                      "--validation_file", _write_jsonl(tmp_path / "dev.jsonl", texts[:8]),
                                      "--block_size", "16", "--no_packing", *SHORT, "--learning_rate", "1.0"], caplog)
    assert "tokens' frequencies" in callback.constant_loss.source
    assert callback.report is not None and callback.report.step <= STEPS_PER_EPOCH, callback.report
    assert len(warnings) == 1
