"""``bitfit-hf predict`` never changes its input silently: a pair given to a tagger, or to a classifier trained on
single texts (or a single text to a pair classifier), is refused with one error line naming the input; an input
longer than the model reads is run on its first tokens with a warning on stderr that says so (the tagger names
the words left untagged). Tiny models with a real (small) WordPiece tokenizer, built here."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from bitfit_hf import BitFitAdapter, apply_bitfit
from bitfit_hf.cli.main import main

WORDS = "the a cat dog sat ran film good bad long dull and is was on mat".split()


def tiny_adapter(tmp_path, head: str = "seq", metadata=None):
    """A tiny BERT base saved as ``base`` and an adapter of it (with the tokenizer) saved as ``adapter``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = T.BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True)
    labels = {"seq": ["negative", "positive"], "tok": ["DT", "NN", "VB"], "qa": None}[head]
    config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          vocab_size=100, max_position_embeddings=64)
    if labels:
        config.num_labels = len(labels)
        config.id2label = dict(enumerate(labels))
        config.label2id = {name: i for i, name in enumerate(labels)}
    cls = {"seq": T.BertForSequenceClassification, "tok": T.BertForTokenClassification,
           "qa": T.BertForQuestionAnswering}[head]
    torch.manual_seed(0)
    model = cls(config).eval()
    model.save_pretrained(tmp_path / "base")
    apply_bitfit(model)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.1 * torch.randn_like(param))
    adapter = BitFitAdapter.from_model(model, base_model_name_or_path=str(tmp_path / "base"), metadata=metadata)
    adapter.save_pretrained(str(tmp_path / "adapter"))
    tokenizer.save_pretrained(str(tmp_path / "adapter"))
    return str(tmp_path / "adapter")


def predict(capsys, *argv):
    """``bitfit-hf predict ARGV``: (status, stdout, our own stderr lines: warnings and errors; the loading
    progress bars transformers prints are left out)."""
    capsys.readouterr()
    status = main(["predict", *argv])
    captured = capsys.readouterr()
    ours = "".join(line + "\n" for line in captured.err.splitlines() if "warning:" in line or "error:" in line)
    return status, captured.out, ours


def test_a_tagger_refuses_a_pair_instead_of_dropping_its_second_half(tmp_path, capsys):
    adapter = tiny_adapter(tmp_path, "tok")
    status, out, err = predict(capsys, adapter, "the cat sat", "the dog ran ||| on the mat")
    assert status == 2 and out == ""
    assert err.count("error:") == 1 and "input 2 is a pair" in err and "tags one sentence" in err
    inputs = tmp_path / "in.txt"
    inputs.write_text("the cat sat\nthe dog\tran\n")
    status, out, err = predict(capsys, adapter, "--file", str(inputs))
    assert status == 2 and "input 2 is a pair" in err


def test_a_single_text_classifier_refuses_a_pair_and_a_pair_classifier_a_single_text(tmp_path, capsys):
    single = tiny_adapter(tmp_path / "single", metadata={"text_columns": ["sentence"]})
    status, out, err = predict(capsys, single, "a good film", "good ||| bad")
    assert status == 2 and out == "" and err.count("error:") == 1
    assert "classifies single texts (trained on the column 'sentence')" in err and "input 2 is a pair" in err
    pair = tiny_adapter(tmp_path / "pair", metadata={"text_columns": ["premise", "hypothesis"]})
    status, out, err = predict(capsys, pair, "the cat sat ||| a cat sat", "a good film")
    assert status == 2 and "classifies pairs (premise, hypothesis)" in err and "input 2 is a single text" in err
    status, out, err = predict(capsys, pair, "the cat sat ||| a cat sat")
    assert status == 0 and out.strip().endswith("the cat sat ||| a cat sat") and err == ""


def test_an_adapter_that_records_no_inputs_takes_both(tmp_path, capsys):
    adapter = tiny_adapter(tmp_path)  # written before adapters recorded their text columns
    status, out, err = predict(capsys, adapter, "a good film", "good ||| bad")
    assert status == 0 and len(out.strip().splitlines()) == 2 and err == ""


def test_a_long_input_is_cut_with_a_warning(tmp_path, capsys):
    adapter = tiny_adapter(tmp_path)
    long_text = " ".join(["the good film"] * 10)  # 30 words, 32 tokens with [CLS] and [SEP]
    status, out, err = predict(capsys, adapter, "a good film", long_text, "--max-length", "16")
    assert status == 0 and len(out.strip().splitlines()) == 2
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "input 2 is 32 tokens long; the model read the first 16 (--max-length 16)" in warnings[0]


def test_the_tagger_names_the_words_it_did_not_tag(tmp_path, capsys):
    adapter = tiny_adapter(tmp_path, "tok")
    words = ["the", "cat", "sat", "on", "the", "mat"] * 4  # 24 words
    status, out, err = predict(capsys, adapter, " ".join(words), "--max-length", "12")
    assert status == 0
    tagged = out.split()
    assert len(tagged) == 24 and tagged[-1] == "mat/?" and tagged[0].split("/")[1] in {"DT", "NN", "VB"}
    assert "input 1: words 11-24 of 24 are past the 12-token limit and were not tagged (shown as word/?; --max-length 12)" in err


def test_a_qa_context_longer_than_the_model_reads_is_read_in_windows(tmp_path, capsys):
    adapter = tiny_adapter(tmp_path, "qa")
    context = " ".join(["the cat sat on the mat"] * 6)  # 38 tokens with the question; 20 read at a time
    status, out, err = predict(capsys, adapter, f"who sat ||| {context}", "--max-length", "20")
    assert status == 0 and err == ""  # nothing cut, nothing to warn about
    answer, score, question = out.strip().split("\t")
    assert answer and answer in context and 0 < float(score) <= 1 and question == "who sat"
    status, out, err = predict(capsys, adapter, f"who sat ||| {context}", "--doc-stride", "-1")
    assert status == 2 and "--doc-stride must be at least 0" in err


def test_a_max_length_the_model_cannot_take_is_lowered_and_a_bad_one_refused(tmp_path, capsys):
    adapter = tiny_adapter(tmp_path)
    status, out, err = predict(capsys, adapter, " ".join(["good"] * 100))  # 102 tokens; 64 positions
    assert status == 0 and "the model read the first 64" in err
    status, out, err = predict(capsys, adapter, "good", "--max-length", "0")
    assert status == 2 and "--max-length must be at least 1" in err


@pytest.mark.parametrize("head", ["seq", "tok"])
def test_short_inputs_give_no_warning(tmp_path, capsys, head):
    status, out, err = predict(capsys, tiny_adapter(tmp_path, head), "the cat sat")
    assert status == 0 and err == ""


def test_the_trainer_records_the_text_columns_predict_checks(tmp_path):
    from datasets import Dataset

    from bitfit_hf import BitFitTrainer

    model = T.BertForSequenceClassification(T.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                         intermediate_size=64, vocab_size=100))
    args = T.TrainingArguments(str(tmp_path / "out"), report_to=[], use_cpu=True, disable_tqdm=True)
    data = Dataset.from_dict({"input_ids": [[5, 6, 7]], "attention_mask": [[1, 1, 1]], "labels": [0]})
    trainer = BitFitTrainer(model, args, train_dataset=data, adapter_metadata={"text_columns": ["premise", "hypothesis"]})
    trainer.save_model(str(tmp_path / "adapter"))
    metadata = BitFitAdapter.from_pretrained(str(tmp_path / "adapter")).config.metadata
    assert metadata["text_columns"] == ["premise", "hypothesis"] and "training_args" in metadata
