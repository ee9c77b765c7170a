"""A QA context of about 2,000 tokens whose answer lies past token 1,500 (the model reads 64 at a time) is
found by `bitfit-hf predict` and by `pipeline("question-answering")` alike (the server: tests/serving/
test_serve_inference.py): every window of the context is read, with the same windows and decoding."""

from __future__ import annotations

import pytest
from serving.tiny import NEEDLE, long_qa, make_needle_qa, tiny_tokenizer

from bitfit_hf.cli.main import main


@pytest.fixture(scope="module")
def needle(tmp_path_factory) -> str:
    return make_needle_qa(str(tmp_path_factory.mktemp("needle")))


def test_the_answer_lies_past_token_1500():
    question, context, start = long_qa()
    tok = tiny_tokenizer()
    assert len(tok(context[:start])["input_ids"]) > 1500 and len(tok(context)["input_ids"]) > 1900
    assert context[start:start + len(NEEDLE)] == NEEDLE and context.count(NEEDLE) == 1


def test_predict_reads_the_whole_context(needle, capsys):
    question, context, _ = long_qa()
    capsys.readouterr()
    assert main(["predict", needle, f"{question} ||| {context}"]) == 0
    captured = capsys.readouterr()
    answer, score, asked = captured.out.strip().split("\t")
    assert answer == NEEDLE and float(score) > 0.9 and asked == question
    assert "warning" not in captured.err  # nothing was cut


def test_the_question_answering_pipeline_reads_the_whole_context(needle):
    from transformers import pipeline

    import bitfit_hf  # noqa: F401 - registers the pipeline
    from bitfit_hf import AutoBitFitModel

    question, context, start = long_qa()
    qa = pipeline("question-answering", model=AutoBitFitModel.from_pretrained(needle).eval(), tokenizer=tiny_tokenizer())
    found = qa(question=question, context=context)
    assert found["answer"] == NEEDLE and (found["start"], found["end"]) == (start, start + len(NEEDLE))
    assert qa({"question": question, "context": context}) == found
    several = qa([{"question": question, "context": context}, {"question": question, "context": context[:start + 30]}])
    assert [a["start"] for a in several] == [start, start]
    assert len(qa(question=question, context=context, top_k=3)) == 3
    # The windows matter: a model that read only the first 64 tokens could not have found it.
    assert qa(question=question, context=context[:start - 1])["answer"] != NEEDLE
