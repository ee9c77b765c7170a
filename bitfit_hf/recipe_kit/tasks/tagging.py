"""Token classification (Penn Treebank POS tagging): files, tag sets, first-sub-token label alignment.

Words carry one tag each. After sub-word tokenisation the tag goes on a word's FIRST sub-token; the
other sub-tokens and the special tokens get ``-100`` and are ignored by the loss and by the metric,
so the reported accuracy is over words (``bitfit_hf.metrics.tokens.token_accuracy``).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.training.collapse import ConstantLoss, label_entropy, warn_if_constant

logger = logging.getLogger(__name__)

__all__ = [
    "IGNORE_INDEX",
    "PTB_TAGS",
    "TOKEN_COLUMN_CANDIDATES",
    "TAG_COLUMN_CANDIDATES",
    "resolve_tagging_columns",
    "resolve_tag_set",
    "check_tagged_split",
    "align_labels_with_words",
    "make_tokenize_and_align",
    "read_tagging_native",
    "word_level_predictions",
    "warn_if_constant_tags",
    "constant_loss",
    "write_tagged_predictions",
]

IGNORE_INDEX = -100

#: The 45 tags of the Penn Treebank tag set (Marcus et al. 1993), in the usual order.
PTB_TAGS: Tuple[str, ...] = (
    "CC", "CD", "DT", "EX", "FW", "IN", "JJ", "JJR", "JJS", "LS", "MD", "NN", "NNS", "NNP", "NNPS", "PDT", "POS",
    "PRP", "PRP$", "RB", "RBR", "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT", "WP",
    "WP$", "WRB", "#", "$", ".", ",", ":", "(", ")", "``", "''",
)
#: Spellings some PTB releases use instead of ( ) and for empty elements.
PTB_VARIANTS: Tuple[str, ...] = ("-LRB-", "-RRB-", "-NONE-")

TOKEN_COLUMN_CANDIDATES = ("tokens", "words")
TAG_COLUMN_CANDIDATES = ("pos_tags", "tags", "pos", "xpos", "upos", "labels", "ner_tags")


def resolve_tagging_columns(
    dataset, split: str, text_column: Optional[str], label_column: Optional[str], need_labels: bool = True
) -> Tuple[str, Optional[str]]:
    """The word and tag columns (``--text_column_name`` / ``--label_column_name``, or the usual names)."""
    columns = list(dataset.column_names)

    def pick(given, candidates, what, flag):
        if given is not None:
            if given not in columns:
                raise RecipeError(
                    f"the {split!r} split has no {what} column {given!r}; its columns are: {', '.join(columns)}."
                )
            return given
        for name in candidates:
            if name in columns:
                return name
        return None

    text = pick(text_column, TOKEN_COLUMN_CANDIDATES, "word", "--text_column_name")
    if text is None:
        raise RecipeError(
            f"the {split!r} split has no word column ({' or '.join(TOKEN_COLUMN_CANDIDATES)}); its columns are: "
            f"{', '.join(columns)}. Name it with --text_column_name."
        )
    label = pick(label_column, TAG_COLUMN_CANDIDATES, "tag", "--label_column_name")
    if label is None and need_labels:
        raise RecipeError(
            f"the {split!r} split has no tag column ({', '.join(TAG_COLUMN_CANDIDATES)}); its columns are: "
            f"{', '.join(columns)}. Name it with --label_column_name."
        )
    return text, label


def _sequence_classlabel_names(feature) -> Optional[List[str]]:
    inner = getattr(feature, "feature", None)
    if inner is None and isinstance(feature, list) and feature:
        inner = feature[0]
    if type(inner).__name__ == "ClassLabel":
        return list(inner.names)
    return None


def resolve_tag_set(raw, label_column: str, splits: Sequence[str] = ("train", "validation", "test")) -> Tuple[List[str], bool]:
    """The tag set and whether the data holds tag ids (a ``Sequence(ClassLabel)`` column).

    ClassLabel names when the data has them; the Penn Treebank tag set when every tag of the
    training data is a PTB tag (so a rare tag absent from a small training set is still a label); the
    sorted tags of the training split otherwise.
    """
    reference_split = next((s for s in splits if s in raw and label_column in raw[s].column_names), None)
    if reference_split is None:
        raise RecipeError(f"no split has the tag column {label_column!r}.")
    names = _sequence_classlabel_names(raw[reference_split].features[label_column])
    if names is not None:
        return names, True
    train_tags = {tag for seq in raw[reference_split][label_column] for tag in seq}
    if not train_tags:
        raise RecipeError(f"the {reference_split!r} split has no tags at all (empty sentences only).")
    non_str = [t for t in train_tags if not isinstance(t, str)]
    if non_str:
        # integer tag ids without names
        ids = sorted(int(t) for t in train_tags)
        if ids[0] < 0:
            raise RecipeError(f"the {reference_split!r} split holds negative tag ids ({ids[0]}).")
        return [str(i) for i in range(ids[-1] + 1)], True
    ptb = set(PTB_TAGS) | set(PTB_VARIANTS)
    if train_tags <= ptb:
        seen = {tag for s in splits if s in raw and label_column in raw[s].column_names for seq in raw[s][label_column] for tag in seq}
        return list(PTB_TAGS) + [v for v in PTB_VARIANTS if v in seen], False
    return sorted(train_tags), False


def check_tagged_split(dataset, split: str, text_column: str, label_column: Optional[str], label_list: List[str], ids: bool) -> None:
    """Each example: a list of words, as many tags as words, every tag in the tag set."""
    known = set(range(len(label_list))) if ids else set(label_list)
    words_col = dataset[text_column]
    tags_col = dataset[label_column] if label_column is not None and label_column in dataset.column_names else None
    bad_tags: Dict[Any, int] = {}
    for row, words in enumerate(words_col):
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise RecipeError(f"the {split!r} split, row {row}: column {text_column!r} must hold a list of words.")
        if tags_col is None:
            continue
        tags = tags_col[row]
        if tags is None or len(tags) != len(words):
            raise RecipeError(
                f"the {split!r} split, row {row}: {len(words)} words but {0 if tags is None else len(tags)} tags."
            )
        for tag in tags:
            if tag not in known:
                bad_tags[tag] = bad_tags.get(tag, 0) + 1
    if bad_tags:
        shown = ", ".join(f"{t!r} ({n}x)" for t, n in sorted(bad_tags.items(), key=lambda kv: -kv[1])[:8])
        raise RecipeError(
            f"the {split!r} split has tags outside the label set: {shown}. The label set "
            f"({len(label_list)} tags) comes from the training data: {', '.join(map(str, label_list[:50]))}."
        )


def align_labels_with_words(
    word_ids: Sequence[Optional[int]],
    word_labels: Sequence[int],
    label_all_tokens: bool = False,
    ignore_index: int = IGNORE_INDEX,
) -> List[int]:
    """Per-sub-token labels: a word's label on its first sub-token, ``ignore_index`` elsewhere.

    ``word_ids`` is the tokenizer's ``word_ids()`` (``None`` for special tokens). With
    ``label_all_tokens`` the later sub-tokens of a word repeat its label instead.
    """
    labels: List[int] = []
    previous: Optional[int] = None
    for word_id in word_ids:
        if word_id is None:
            labels.append(ignore_index)
        elif word_id != previous:
            labels.append(int(word_labels[word_id]))
        else:
            labels.append(int(word_labels[word_id]) if label_all_tokens else ignore_index)
        previous = word_id
    return labels


def make_tokenize_and_align(
    tokenizer,
    text_column: str,
    label_column: Optional[str],
    label_to_id: Optional[Dict[Any, int]],
    max_seq_length: Optional[int],
    padding,
    label_all_tokens: bool = False,
) -> Callable:
    """A batched ``datasets.map`` function: tokenise pre-split words and align the tags.

    Adds ``labels`` and ``words_dropped`` (words that lost all their sub-tokens to truncation). When
    ``label_column`` is ``None`` (unlabelled prediction data) every first sub-token gets label 0, so
    predictions can still be read back per word; no metric is computed then.
    """

    def tokenize(batch):
        encoding = tokenizer(
            batch[text_column],
            is_split_into_words=True,
            truncation=True,
            max_length=max_seq_length,
            padding=padding,
        )
        all_labels, dropped = [], []
        for i, words in enumerate(batch[text_column]):
            word_ids = encoding.word_ids(i)
            if label_column is None:
                ids = [0] * len(words)
            elif label_to_id is None:
                ids = [int(t) for t in batch[label_column][i]]
            else:
                ids = [label_to_id[t] for t in batch[label_column][i]]
            all_labels.append(align_labels_with_words(word_ids, ids, label_all_tokens))
            dropped.append(len(words) - len({w for w in word_ids if w is not None}))
        encoding["labels"] = all_labels
        encoding["words_dropped"] = dropped
        return encoding

    return tokenize


def word_level_predictions(predictions: np.ndarray, labels: np.ndarray, ignore_index: int = IGNORE_INDEX) -> List[List[int]]:
    """Per example, the predicted id at each labelled (first-sub-token) position, in order."""
    if predictions.ndim == labels.ndim + 1:
        predictions = predictions.argmax(-1)
    return [[int(p) for p, l in zip(pred_row, label_row) if l != ignore_index] for pred_row, label_row in zip(predictions, labels)]


def warn_if_constant_tags(predictions: np.ndarray, labels: np.ndarray, tag_names: Optional[Sequence[str]] = None,
                          ignore_index: int = IGNORE_INDEX) -> bool:
    """Warn when every scored word (labelled sub-token) got the same tag: the run learned nothing from the
    sentence, whatever its accuracy (NN for every word scores about 14% on the WSJ sample). ``predictions``:
    tag ids or logits, aligned with ``labels``. Returns whether it warned."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.ndim == labels.ndim + 1:
        predictions = predictions.argmax(-1)
    scored = labels != ignore_index
    return warn_if_constant(predictions[scored], labels[scored], "scored words", "tag", source=logger, names=tag_names)


def constant_loss(features) -> Optional[ConstantLoss]:
    """The training loss of the best prediction that ignores the sentence: the entropy of the tags the loss sees
    (the training features' ``labels``, -100 left out). What :class:`CollapseCallback` watches for."""
    if features is None or "labels" not in features.column_names:
        return None
    value = label_entropy(features["labels"], ignore_index=IGNORE_INDEX)
    return None if value is None else ConstantLoss(value, "the entropy of the training tags")


# --------------------------------------------------------------------------- files


def _is_tagged_token(piece: str) -> bool:
    word, sep, tag = piece.rpartition("/")
    return bool(sep and word and tag)


def _looks_tagged(path: str, sample_lines: int = 20) -> bool:
    """True when most tokens of the first non-blank lines are ``word/TAG``.

    A majority vote rather than "every token": one token without its ``/TAG`` in a word/TAG file must
    give an error naming that line (from :func:`read_tagged_text`), not a misreading as CoNLL columns,
    where word and tag sit in separate columns and almost no token contains a slash.
    """
    tagged = total = lines = 0
    with open(path, encoding="utf-8-sig") as handle:
        for line in handle:
            pieces = line.split()
            if not pieces:
                continue
            tagged += sum(_is_tagged_token(p) for p in pieces)
            total += len(pieces)
            lines += 1
            if lines >= sample_lines:
                break
    return total > 0 and tagged / total >= 0.5


def read_tagging_native(path: str, tag_key: str = "pos_tags"):
    """``word/TAG`` text (one sentence per line) or CoNLL columns (one token per line, blank lines between
    sentences; word in the first column, tag in the last); ``None`` for csv/json/jsonl files."""
    import datasets

    from bitfit_hf.data import read_conll, read_tagged_text

    extension = os.path.splitext(path)[1].lower()
    if extension in (".csv", ".json", ".jsonl", ".tsv"):
        return None
    try:
        if _looks_tagged(path):
            rows = read_tagged_text(path)
        else:
            rows = read_conll(path, tag_key=tag_key)
    except ValueError as err:
        raise RecipeError(f"cannot read {path} as word/TAG text or CoNLL columns: {err}") from None
    if not rows:
        raise RecipeError(f"{path} holds no sentences (empty split).")
    rows = [{"tokens": r["tokens"], tag_key: r.get(tag_key, r.get("pos_tags")), "id": str(i)} for i, r in enumerate(rows)]
    features = datasets.Features(
        {
            "tokens": datasets.Sequence(datasets.Value("string")),
            tag_key: datasets.Sequence(datasets.Value("string")),
            "id": datasets.Value("string"),
        }
    )
    return datasets.Dataset.from_list(rows, features=features)


def write_tagged_predictions(path: str, sentences: Sequence[Sequence[str]], tags: Sequence[Sequence[str]], missing: str = "_") -> int:
    """One line per sentence of ``word/TAG`` (the WSJ sample's format). Words whose prediction is
    missing (truncated away) get ``missing``. Returns how many words that was."""
    from bitfit_hf.utils.io import write_text_atomic

    lines, missed = [], 0
    for words, predicted in zip(sentences, tags):
        out = []
        for i, word in enumerate(words):
            tag = predicted[i] if i < len(predicted) else missing
            missed += i >= len(predicted)
            out.append(f"{word.replace('/', chr(92) + '/')}/{tag}")
        lines.append(" ".join(out))
    write_text_atomic(path, "\n".join(lines) + "\n")
    return missed
