"""Pure-Python readers for the offline data files (and for files of the same formats).

Every reader returns a list of dicts, or a :class:`datasets.Dataset` when
``as_dataset=True`` (``datasets`` is imported only then).  Malformed input raises
:class:`ValueError` whose message starts with ``"<file>:<line>: "`` (for JSON:
``"<file>: data[i].paragraphs[j]...: "``).

Counts of the real files (see :mod:`bitfit_hf.data.assets`):

* ``movie_reviews`` (movieReviewSnippets_GroundTruth.txt): 10,605 lines --
  5,242 rated > 0, 5,326 rated < 0, 37 rated exactly 0.  :func:`read_movie_reviews`
  drops the 37 zero-rated rows and returns **10,568** rows (5,242 label 1,
  5,326 label 0).
* ``wsj_pos`` (tagged-en-wsj.txt): 1,001 lines, 25,026 tokens, 44 Penn Treebank
  tags; one example per line (some lines hold more than one sentence).  The file
  has no escaped slashes, but ``\\/`` escapes (``1\\/2/CD``) are handled.
* ``squad_dev`` (dev-v1.1.json): 48 articles, 2,067 paragraphs, **10,570**
  questions (BIG-bench's copy, an equivalent source, removed 5).
* ``squad_train`` (train-v1.1.json): 442 articles, 18,896 paragraphs, **87,599** questions.
* ``snli`` (snli_1.0_test.jsonl): 10,000 premise/hypothesis pairs; :func:`read_snli_jsonl` drops the 176
  without a gold label and returns **9,824** rows -- entailment 3,368, neutral 3,219, contradiction 3,237.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = [
    "read_movie_reviews",
    "read_editorial_articles",
    "read_tagged_text",
    "read_conll",
    "read_squad_json",
    "read_bigbench_claims",
    "read_snli_jsonl",
    "MOVIE_REVIEW_LABELS",
    "CLAIM_LABELS",
    "NLI_LABELS",
]

#: Label names of :func:`read_movie_reviews` (index = label id).
MOVIE_REVIEW_LABELS = ("negative", "positive")

#: Label names of :func:`read_bigbench_claims` (index = label id), BIG-bench's answer choices.
CLAIM_LABELS = ("True", "False", "Neither")

def _to_dataset(rows: list[dict[str, Any]], features: Any):
    import datasets

    if not rows:
        return datasets.Dataset.from_dict({k: [] for k in features}, features=features)
    return datasets.Dataset.from_list(rows, features=features)


def _lines(path: str | os.PathLike[str]):
    # utf-8-sig drops a leading BOM; universal newlines turn CRLF (movie reviews) into "\n"
    with open(path, encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, start=1):
            yield lineno, line.rstrip("\n")


# --------------------------------------------------------------------------- sentiment


def read_movie_reviews(
    path: str | os.PathLike[str],
    as_dataset: bool = False,
    keep_rating: bool = False,
):
    """Read the VADER movie-review ground truth: ``id<TAB>rating<TAB>text`` per line.

    Returns rows ``{"sentence": str, "label": int}`` with label 1 for a mean
    rating > 0 and 0 for a rating < 0; rows rated exactly 0 are dropped (37 of
    the 10,605 lines of the real file, leaving 10,568).  ``keep_rating=True``
    adds ``"id"`` (str) and ``"rating"`` (float).  Blank lines are ignored.

    Raises:
        ValueError: a line without three tab-separated fields, with an empty
            text, or with a rating that is not a number (names file and line).
    """
    rows: list[dict[str, Any]] = []
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        parts = line.split("\t", 2)
        if len(parts) != 3:
            raise ValueError(
                f"{path}:{lineno}: expected 3 tab-separated fields (id, rating, text), got {len(parts)}: {line[:80]!r}"
            )
        ident, rating_s, text = parts
        try:
            rating = float(rating_s)
        except ValueError:
            raise ValueError(f"{path}:{lineno}: rating {rating_s!r} is not a number") from None
        if rating != rating:  # NaN
            raise ValueError(f"{path}:{lineno}: rating is NaN")
        text = text.strip()
        if not text:
            raise ValueError(f"{path}:{lineno}: empty sentence")
        if rating == 0:
            continue
        row: dict[str, Any] = {"sentence": text, "label": 1 if rating > 0 else 0}
        if keep_rating:
            row["id"] = ident.strip()
            row["rating"] = rating
        rows.append(row)
    if not as_dataset:
        return rows
    import datasets

    spec = {"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=list(MOVIE_REVIEW_LABELS))}
    if keep_rating:
        spec.update(id=datasets.Value("string"), rating=datasets.Value("float64"))
    return _to_dataset(rows, datasets.Features(spec))


def read_editorial_articles(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read VADER's NYT editorial snippets (``article_sentence<TAB>rating<TAB>text``) back into articles.

    Returns ``{"id": article id, "text": its sentences joined in order}`` per article, in file order:
    running English prose for language modelling (the ratings are dropped).

    Raises:
        ValueError: a line without three tab-separated fields or with an id that is not ``N_M``.
    """
    articles: dict[str, list[tuple[int, str]]] = {}
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        parts = line.split("\t", 2)
        if len(parts) != 3:
            raise ValueError(f"{path}:{lineno}: expected 3 tab-separated fields (id, rating, text), got {len(parts)}")
        article, _, sentence = parts[0].strip().partition("_")
        if not article or not sentence.isdigit():
            raise ValueError(f"{path}:{lineno}: id {parts[0]!r} is not article_sentence")
        if parts[2].strip():
            articles.setdefault(article, []).append((int(sentence), parts[2].strip()))
    return [{"id": a, "text": " ".join(text for _, text in sorted(s))} for a, s in articles.items()]


# --------------------------------------------------------------------------- tagging


def read_tagged_text(
    path: str | os.PathLike[str],
    as_dataset: bool = False,
    unescape: bool = True,
):
    """Read ``word/TAG`` tokens separated by whitespace, one example per non-blank line.

    Each token is split on its LAST ``/`` so words that contain slashes keep
    them (``1\\/2/CD`` and ``1/2/CD`` -> word ``1/2``, tag ``CD``).  With
    ``unescape`` (default) the Penn Treebank escape ``\\/`` in a word becomes
    ``/``.  Returns rows ``{"tokens": [...], "pos_tags": [...]}`` with tags as
    strings.

    Raises:
        ValueError: a token with no ``/``, an empty word or an empty tag
            (names file, line and token).
    """
    rows: list[dict[str, Any]] = []
    for lineno, line in _lines(path):
        pieces = line.split()
        if not pieces:
            continue
        tokens: list[str] = []
        tags: list[str] = []
        for piece in pieces:
            word, sep, tag = piece.rpartition("/")
            if not sep or not word or not tag:
                raise ValueError(f"{path}:{lineno}: token {piece!r} is not of the form word/TAG")
            if _ends_with_escape(word):
                raise ValueError(
                    f"{path}:{lineno}: token {piece!r} has no unescaped '/' before its tag "
                    "(its last '/' is escaped as '\\/'): missing /TAG?"
                )
            tokens.append(word.replace("\\/", "/") if unescape else word)
            tags.append(tag)
        rows.append({"tokens": tokens, "pos_tags": tags})
    if not as_dataset:
        return rows
    import datasets

    features = datasets.Features(
        {"tokens": datasets.Sequence(datasets.Value("string")), "pos_tags": datasets.Sequence(datasets.Value("string"))}
    )
    return _to_dataset(rows, features)


def _ends_with_escape(word: str) -> bool:
    """True when ``word`` ends in an odd run of backslashes, i.e. the '/' after it was escaped.

    A bare ``\\`` is a real token (the OANC file tags a lone backslash: ``\\/NN``).
    """
    run = len(word) - len(word.rstrip("\\"))
    return run % 2 == 1 and run != len(word)


def read_conll(
    path: str | os.PathLike[str],
    token_column: int = 0,
    tag_column: int = -1,
    as_dataset: bool = False,
    tag_key: str = "tags",
    delimiter: str | None = None,
):
    """Read a CoNLL-style column file: one token per line, sentences separated by blank lines.

    Columns are split on whitespace (or on ``delimiter``).  ``-DOCSTART-`` lines
    are skipped.  Returns rows ``{"tokens": [...], tag_key: [...]}``.

    Raises:
        ValueError: a line lacking ``token_column`` or ``tag_column``
            (names file and line).
    """
    rows: list[dict[str, Any]] = []
    tokens: list[str] = []
    tags: list[str] = []

    def flush() -> None:
        if tokens:
            rows.append({"tokens": list(tokens), tag_key: list(tags)})
            tokens.clear()
            tags.clear()

    for lineno, line in _lines(path):
        stripped = line.strip()
        if not stripped:
            flush()
            continue
        cols = stripped.split(delimiter) if delimiter is not None else stripped.split()
        if cols[0] == "-DOCSTART-":
            flush()
            continue
        try:
            token, tag = cols[token_column], cols[tag_column]
        except IndexError:
            raise ValueError(
                f"{path}:{lineno}: expected columns {token_column} (token) and {tag_column} (tag), "
                f"line has {len(cols)} column(s): {line[:80]!r}"
            ) from None
        if delimiter is not None:
            token, tag = token.strip(), tag.strip()
        if not token or not tag:
            raise ValueError(f"{path}:{lineno}: empty token or tag: {line[:80]!r}")
        tokens.append(token)
        tags.append(tag)
    flush()
    if not as_dataset:
        return rows
    import datasets

    features = datasets.Features(
        {"tokens": datasets.Sequence(datasets.Value("string")), tag_key: datasets.Sequence(datasets.Value("string"))}
    )
    return _to_dataset(rows, features)


# --------------------------------------------------------------------------- SQuAD


def _need(obj: Any, key: str, kind: type | tuple[type, ...], where: str, path: Any) -> Any:
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: {where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise ValueError(f"{path}: {where}: missing key {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ValueError(f"{path}: {where}.{key}: expected {names}, got {type(value).__name__}")
    return value


def read_squad_json(path: str | os.PathLike[str], as_dataset: bool = False):
    """Flatten a SQuAD v1.1 JSON file into one row per question.

    Rows follow the Hub ``squad`` schema: ``{"id", "title", "context",
    "question", "answers": {"text": [...], "answer_start": [...]}}`` (no
    stripping; a missing ``title`` becomes ``""``, missing ``answers`` become
    empty lists, as in unanswered test files).

    Raises:
        ValueError: invalid JSON (names file, line and column) or a missing /
            mistyped key (names file and JSON location, e.g.
            ``data[3].paragraphs[0].qas[2]``).
    """
    try:
        with open(path, encoding="utf-8-sig") as fh:
            doc = json.load(fh)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON (column {exc.colno}): {exc.msg}") from None
    articles = _need(doc, "data", list, "top level", path)
    rows: list[dict[str, Any]] = []
    for i, article in enumerate(articles):
        where_a = f"data[{i}]"
        paragraphs = _need(article, "paragraphs", list, where_a, path)
        title = article.get("title", "")
        if not isinstance(title, str):
            raise ValueError(f"{path}: {where_a}.title: expected str, got {type(title).__name__}")
        for j, paragraph in enumerate(paragraphs):
            where_p = f"{where_a}.paragraphs[{j}]"
            context = _need(paragraph, "context", str, where_p, path)
            qas = _need(paragraph, "qas", list, where_p, path)
            for k, qa in enumerate(qas):
                where_q = f"{where_p}.qas[{k}]"
                qid = _need(qa, "id", (str, int), where_q, path)
                question = _need(qa, "question", str, where_q, path)
                answers = qa.get("answers", [])
                if not isinstance(answers, list):
                    raise ValueError(f"{path}: {where_q}.answers: expected list, got {type(answers).__name__}")
                texts: list[str] = []
                starts: list[int] = []
                for m, answer in enumerate(answers):
                    where_ans = f"{where_q}.answers[{m}]"
                    texts.append(_need(answer, "text", str, where_ans, path))
                    starts.append(_need(answer, "answer_start", int, where_ans, path))
                rows.append(
                    {
                        "id": str(qid),
                        "title": title,
                        "context": context,
                        "question": question,
                        "answers": {"text": texts, "answer_start": starts},
                    }
                )
    if not as_dataset:
        return rows
    import datasets

    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "title": datasets.Value("string"),
            "context": datasets.Value("string"),
            "question": datasets.Value("string"),
            "answers": datasets.Sequence(
                {"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}
            ),
        }
    )
    return _to_dataset(rows, features)


# --------------------------------------------------------------------------- claim verification


def read_bigbench_claims(path: str | os.PathLike[str], as_dataset: bool = False):
    """Read a BIG-bench fact-verification ``task.json`` (``vitaminc_fact_verification``).

    Each example's ``input`` is ``"<page title>: <evidence>\nClaim: <claim>"`` and its
    ``target_scores`` give 1 to exactly one of True / False / Neither. Returns rows
    ``{"title", "evidence", "claim", "label"}``: ``evidence`` keeps the page-title prefix (the
    title is part of what the model reads), ``title`` is repeated on its own so splits can keep
    every page on one side, and ``label`` indexes :data:`CLAIM_LABELS`.

    Raises:
        ValueError: invalid JSON, no ``examples`` list, an input without ``"\nClaim: "``, or
            target scores that do not name exactly one known label (names file and example index).
    """
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON (column {exc.colno}): {exc.msg}") from None
    examples = _need(doc, "examples", list, "top level", path)
    rows: list[dict[str, Any]] = []
    for i, example in enumerate(examples):
        where = f"examples[{i}]"
        text = _need(example, "input", str, where, path)
        scores = _need(example, "target_scores", dict, where, path)
        evidence, sep, claim = text.partition("\nClaim: ")
        if not sep or not evidence.strip() or not claim.strip():
            raise ValueError(f"{path}: {where}.input: expected '<evidence>\\nClaim: <claim>', got {text[:80]!r}")
        chosen = [name for name, score in scores.items() if score]
        if len(chosen) != 1 or chosen[0] not in CLAIM_LABELS:
            raise ValueError(
                f"{path}: {where}.target_scores: expected exactly one of {', '.join(CLAIM_LABELS)} scored 1, got {scores}"
            )
        title = evidence.split(": ", 1)[0] if ": " in evidence else ""
        rows.append({"title": title, "evidence": evidence, "claim": claim, "label": CLAIM_LABELS.index(chosen[0])})
    if not as_dataset:
        return rows
    import datasets

    features = datasets.Features(
        {
            "title": datasets.Value("string"),
            "evidence": datasets.Value("string"),
            "claim": datasets.Value("string"),
            "label": datasets.ClassLabel(names=list(CLAIM_LABELS)),
        }
    )
    return _to_dataset(rows, features)


# --------------------------------------------------------------------------- natural language inference

NLI_LABELS = ("entailment", "neutral", "contradiction")


def read_snli_jsonl(path: str | os.PathLike[str], as_dataset: bool = False):
    """Read SNLI's JSON lines (``snli_1.0_*.jsonl``; MultiNLI's files have the same fields).

    Returns rows ``{"premise", "hypothesis", "label", "caption_id"}``: ``label`` indexes :data:`NLI_LABELS`;
    ``caption_id`` names the premise (several hypotheses share one), so splits can keep a premise on one
    side. Pairs whose annotators reached no majority (gold label ``"-"``) are dropped, as SNLI's papers do.

    Raises:
        ValueError: a line that is not a JSON object, a missing field, or an unknown gold label
            (names file and line).
    """
    rows: list[dict[str, Any]] = []
    for lineno, line in _lines(path):
        line = line.strip()
        if not line:
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: invalid JSON (column {exc.colno}): {exc.msg}") from None
        for key in ("gold_label", "sentence1", "sentence2"):
            if not isinstance(record, dict) or not isinstance(record.get(key), str):
                raise ValueError(f"{where}: expected a JSON object with a string {key!r}")
        gold = record["gold_label"]
        if gold == "-":
            continue
        if gold not in NLI_LABELS:
            raise ValueError(f"{where}: gold_label {gold!r} is none of {', '.join(NLI_LABELS)} (or '-')")
        caption = str(record.get("captionID") or record.get("promptID") or record["sentence1"])
        rows.append({"premise": record["sentence1"], "hypothesis": record["sentence2"],
                     "label": NLI_LABELS.index(gold), "caption_id": caption})
    if not as_dataset:
        return rows
    import datasets

    features = datasets.Features(
        {
            "premise": datasets.Value("string"),
            "hypothesis": datasets.Value("string"),
            "label": datasets.ClassLabel(names=list(NLI_LABELS)),
            "caption_id": datasets.Value("string"),
        }
    )
    return _to_dataset(rows, features)
