"""Sequence classification (GLUE and GLUE-style tasks): columns, labels, tokenisation, metrics.

The nine GLUE tasks come from :data:`bitfit_hf.metrics.glue.GLUE_TASKS` (text columns, label names,
official metrics). Files in GLUE's original layout are understood too: their column names
(``#1 String``, ``Quality``, ``gold_label``, ``is_duplicate``, ``score``, MNLI's ``sentence1``) are
mapped onto the Hub schema, and CoLA's header-less TSV is recognised.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from bitfit_hf.metrics.glue import GLUE_TASKS, GlueTask
from bitfit_hf.metrics.loading import load_metric
from bitfit_hf.recipe_kit.data import check_text_values
from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.training.collapse import ConstantLoss, label_entropy, label_variance
from bitfit_hf.training.collapse import warn_if_constant as warn_constant

logger = logging.getLogger(__name__)

__all__ = [
    "GLUE_TASKS",
    "LabelSpec",
    "canonicalize_glue_columns",
    "resolve_text_columns",
    "resolve_label_spec",
    "encode_labels",
    "is_fully_labelled",
    "check_texts",
    "make_tokenize_function",
    "make_compute_metrics",
    "warn_if_constant",
    "constant_loss",
    "read_glue_native",
    "write_predictions",
    "UNLABELED",
]

UNLABELED = -1  # GLUE's test splits carry label -1

# Column names of GLUE's original files -> the Hub schema (applied when the Hub name is absent).
_GLUE_FILE_ALIASES: Dict[str, Tuple[Tuple[str, str], ...]] = {
    "cola": (),
    "sst2": (),
    "mrpc": (("#1 String", "sentence1"), ("#2 String", "sentence2"), ("Quality", "label")),
    "qqp": (("is_duplicate", "label"),),
    "stsb": (("score", "label"),),
    "mnli": (("sentence1", "premise"), ("sentence2", "hypothesis"), ("gold_label", "label")),
    "qnli": (),
    "rte": (),
    "wnli": (),
}
# CoLA's original train/dev TSVs have no header.
_COLA_FIELDS = ("source", "label", "original_label", "sentence")


def get_task(task_name: Optional[str]) -> Optional[GlueTask]:
    """The :class:`GlueTask` named ``task_name`` (case-insensitive; ``sst-2``/``sts-b`` accepted)."""
    if task_name is None:
        return None
    key = task_name.lower().replace("-", "")
    if key not in GLUE_TASKS:
        raise RecipeError(f"unknown task {task_name!r}; GLUE tasks: {', '.join(GLUE_TASKS)}.")
    return GLUE_TASKS[key]


def canonicalize_glue_columns(dataset, task: Optional[GlueTask]):
    """Rename GLUE original-file columns to the Hub schema (no-op for Hub data and unknown tasks)."""
    if task is None:
        return dataset
    for source, target in _GLUE_FILE_ALIASES[task.name]:
        if source in dataset.column_names and target not in dataset.column_names:
            dataset = dataset.rename_column(source, target)
    return dataset


def resolve_text_columns(
    dataset, split: str, task: Optional[GlueTask], text_column_names: Optional[str], label_column: str
) -> Tuple[str, Optional[str]]:
    """The one or two text columns to feed the model, checked against ``dataset``.

    Precedence: ``--text_column_names a,b``; the GLUE task's columns; ``sentence1``/``sentence2``;
    ``sentence``; ``text``; otherwise the first one or two string columns other than the label.
    """
    columns = list(dataset.column_names)
    if text_column_names:
        names = [n.strip() for n in text_column_names.split(",") if n.strip()]
        if not 1 <= len(names) <= 2:
            raise RecipeError(f"--text_column_names takes one or two comma-separated names, got {text_column_names!r}.")
        keys = (names[0], names[1] if len(names) > 1 else None)
    elif task is not None:
        keys = task.text_keys
    elif "sentence1" in columns and "sentence2" in columns:
        keys = ("sentence1", "sentence2")
    elif "sentence" in columns:
        keys = ("sentence", None)
    elif "text" in columns:
        keys = ("text", None)
    else:
        features = dataset.features
        strings = [c for c in columns if c != label_column and getattr(features[c], "dtype", None) == "string"]
        if not strings:
            raise RecipeError(
                f"the {split!r} split has no text column (columns: {', '.join(columns)}); name them with "
                "--text_column_names."
            )
        keys = (strings[0], strings[1] if len(strings) > 1 else None)
    missing = [k for k in keys if k is not None and k not in columns]
    if missing:
        expected = f" (task {task.name} needs {', '.join(k for k in task.text_keys if k)})" if task else ""
        raise RecipeError(
            f"the {split!r} split has no column {', '.join(repr(m) for m in missing)}{expected}; its columns are: "
            f"{', '.join(columns)}. Use --text_column_names to name the text columns."
        )
    return keys


@dataclass
class LabelSpec:
    """The label set of a classification task (``names`` empty and ``is_regression`` for STS-B style)."""

    names: List[str]
    is_regression: bool = False
    # raw value -> id, for labels given as values rather than ids (custom tasks)
    value_to_id: Optional[Dict[Any, int]] = None

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.names)

    @property
    def id2label(self) -> Dict[int, str]:
        return {i: name for i, name in enumerate(self.names)}

    @property
    def label2id(self) -> Dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}


def _is_classlabel(feature) -> bool:
    return type(feature).__name__ == "ClassLabel"


def resolve_label_spec(raw, task: Optional[GlueTask], label_column: str) -> LabelSpec:
    """The label set: the GLUE task's, else the training split's (ClassLabel names, floats -> regression,
    otherwise the sorted distinct values)."""
    if task is not None:
        if task.is_regression:
            return LabelSpec([], is_regression=True)
        return LabelSpec(list(task.label_names))
    reference = next((raw[s] for s in ("train", "validation", "test") if s in raw and label_column in raw[s].column_names), None)
    if reference is None:
        raise RecipeError(f"no split has the label column {label_column!r}; name it with --label_column_name.")
    feature = reference.features[label_column]
    if _is_classlabel(feature):
        return LabelSpec(list(feature.names))
    dtype = getattr(feature, "dtype", None)
    if dtype in ("float16", "float32", "float64"):
        return LabelSpec([], is_regression=True)
    values = [v for v in reference[label_column] if v is not None and v != UNLABELED]
    distinct = sorted(set(values), key=lambda v: (isinstance(v, str), v))
    if len(distinct) < 2:
        raise RecipeError(
            f"the label column {label_column!r} holds {len(distinct)} distinct value(s) ({distinct}); a classifier "
            "needs at least two."
        )
    return LabelSpec([str(v) for v in distinct], value_to_id={v: i for i, v in enumerate(distinct)})


def _encode_value(value: Any, spec: LabelSpec, allow_unlabeled: bool) -> Any:
    """Label id (or float) of one raw value; raises KeyError when it is outside the label set."""
    if spec.is_regression:
        if value is None:
            if allow_unlabeled:
                return float("nan")
            raise KeyError(value)
        try:
            result = float(value)
        except (TypeError, ValueError):
            raise KeyError(value) from None
        if result != result:
            raise KeyError(value)
        return result
    if value is None or (allow_unlabeled and (value == UNLABELED or value == str(UNLABELED) or value == "")):
        if allow_unlabeled:
            return UNLABELED
        raise KeyError(value)
    if spec.value_to_id is not None:
        if value in spec.value_to_id:
            return spec.value_to_id[value]
        if isinstance(value, str) and value.strip() in spec.value_to_id:
            return spec.value_to_id[value.strip()]
        raise KeyError(value)
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, (int, np.integer)):
        if 0 <= int(value) < len(spec.names):
            return int(value)
        raise KeyError(value)
    if isinstance(value, float) and value.is_integer() and 0 <= int(value) < len(spec.names):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text in spec.names:
            return spec.names.index(text)
        if text.lstrip("-").isdigit() and 0 <= int(text) < len(spec.names):
            return int(text)
    raise KeyError(value)


def encode_labels(dataset, split: str, label_column: str, spec: LabelSpec, allow_unlabeled: bool = False):
    """Replace ``label_column`` by a ``label`` column of ids (floats for regression), checking every value.

    Raises:
        RecipeError: a value outside the label set (names the split, the rows and the label set).
    """
    if label_column not in dataset.column_names:
        if allow_unlabeled:
            return dataset
        raise RecipeError(
            f"the {split!r} split has no label column {label_column!r}; its columns are: "
            f"{', '.join(dataset.column_names)}. Name it with --label_column_name."
        )
    values = dataset[label_column]
    encoded: List[Any] = []
    bad: List[Tuple[int, Any]] = []
    for row, value in enumerate(values):
        try:
            encoded.append(_encode_value(value, spec, allow_unlabeled))
        except KeyError:
            bad.append((row, value))
            encoded.append(None)
    if bad:
        shown = ", ".join(f"row {r}: {v!r}" for r, v in bad[:5])
        what = "a number (regression)" if spec.is_regression else f"one of {spec.names}"
        raise RecipeError(
            f"the {split!r} split has {len(bad)} label(s) outside the label set ({shown}{', ...' if len(bad) > 5 else ''}); "
            f"each label must be {what}"
            + ("" if spec.is_regression else f" or its id 0..{len(spec.names) - 1}")
            + "."
        )
    import datasets

    dataset = dataset.remove_columns([c for c in dict.fromkeys((label_column, "label")) if c in dataset.column_names])

    feature = datasets.Value("float32") if spec.is_regression else datasets.Value("int64")
    return dataset.add_column("label", encoded, feature=feature)


def is_fully_labelled(dataset, spec: LabelSpec) -> bool:
    """Whether every row of an encoded split has a real label (not -1 / NaN), so it can be scored."""
    if "label" not in dataset.column_names or len(dataset) == 0:
        return False
    labels = np.asarray(dataset["label"], dtype=float)
    return bool(np.isfinite(labels).all() if spec.is_regression else (labels >= 0).all())


def check_texts(dataset, split: str, keys: Sequence[Optional[str]], source: Optional[str] = None) -> None:
    """Every text cell must be a string (a CSV with an empty cell gives ``None``); the error names the file and
    line (JSON lines) or the row. ``source``: the file the split was read from."""
    check_text_values(dataset, split, keys, source)


def make_tokenize_function(tokenizer, key1: str, key2: Optional[str], max_seq_length: int, padding) -> Callable:
    """Tokenise one text or a pair, cut at ``max_seq_length``; a fast tokenizer also marks each example it cut
    (column ``cut``, counted and dropped by :func:`bitfit_hf.recipe_kit.data.report_cut`)."""
    def tokenize(batch):
        texts = (batch[key1],) if key2 is None else (batch[key1], batch[key2])
        encoded = tokenizer(*texts, padding=padding, max_length=max_seq_length, truncation=True)
        if getattr(encoded, "encodings", None):
            encoded["cut"] = [bool(e.overflowing) for e in encoded.encodings]
        return encoded

    return tokenize


def warn_if_constant(preds: np.ndarray, labels: np.ndarray) -> bool:
    """Warn when every scored example got the same class: the run learned nothing (it collapsed, or never left its
    start), whatever its accuracy looks like; the warning puts that score beside the majority class's. Returns
    whether it warned (:func:`bitfit_hf.training.collapse.warn_if_constant`, shared with tagging)."""
    return warn_constant(preds, labels, "evaluated examples", "class", source=logger)


def constant_loss(dataset, is_regression: bool) -> Optional[ConstantLoss]:
    """The training loss of the best prediction that ignores the sentence, from the encoded training split's
    labels: their entropy (cross-entropy of predicting the class frequencies), or their variance (the mean
    squared error of predicting their mean) for regression. What :class:`CollapseCallback` watches for."""
    if dataset is None or "label" not in dataset.column_names:
        return None
    labels = dataset["label"]
    if is_regression:
        value = label_variance(labels)
        return None if value is None else ConstantLoss(value, "the variance of the training labels")
    value = label_entropy([label for label in labels if label != UNLABELED])
    return None if value is None else ConstantLoss(value, "the entropy of the training labels")


def make_compute_metrics(task: Optional[GlueTask], is_regression: bool) -> Callable:
    """``compute_metrics`` for ``Trainer``: GLUE's official metrics (the packaged ``evaluate`` module), else
    accuracy (or MSE, Pearson, Spearman for regression)."""

    def compute(eval_pred) -> Dict[str, float]:
        preds = eval_pred.predictions[0] if isinstance(eval_pred.predictions, tuple) else eval_pred.predictions
        labels = np.asarray(eval_pred.label_ids)
        preds = np.squeeze(preds, axis=-1) if is_regression and preds.ndim == 2 else preds
        if not is_regression:
            preds = np.argmax(preds, axis=-1)
            warn_if_constant(preds, labels)
        if task is not None:
            return load_metric("glue", task.name).compute(predictions=preds, references=labels)
        if is_regression:
            from bitfit_hf.metrics.glue import pearson_and_spearman

            out = {"mse": float(np.mean((preds - labels) ** 2))}
            out.update(pearson_and_spearman(preds, labels))
            return out
        return {"accuracy": float((preds == labels).mean())}

    return compute


def read_glue_native(path: str, task: Optional[GlueTask]):
    """GLUE's original TSV files (CoLA's without a header) and MRPC's ``msr_paraphrase_*.txt``;
    ``None`` for anything else (the generic csv/tsv/json loader takes over)."""
    import datasets

    from bitfit_hf.recipe_kit.data import read_tsv

    extension = os.path.splitext(path)[1].lower()
    if extension not in (".tsv", ".txt"):
        return None
    with open(path, encoding="utf-8-sig") as handle:
        first = handle.readline().rstrip("\r\n").split("\t")
    fieldnames = None
    if extension == ".tsv" and task is not None and task.name == "cola" and len(first) == 4 and first[1] in ("0", "1"):
        fieldnames = _COLA_FIELDS
    elif extension == ".txt" and not (first and first[0] == "Quality"):
        return None  # other .txt files: the recipe's own formats
    rows = read_tsv(path, fieldnames)
    if not rows:
        raise RecipeError(f"{path} holds no examples (empty split).")
    converted = []
    for row in rows:
        out = dict(row)
        for key in ("label", "Quality", "is_duplicate", "idx", "index"):
            if key in out and out[key].lstrip("-").isdigit():
                out[key] = int(out[key])
        if "score" in out:
            try:
                out["score"] = float(out["score"])
            except ValueError:
                pass
        converted.append(out)
    return datasets.Dataset.from_list(converted)


def write_predictions(path: str, logits: np.ndarray, spec: LabelSpec) -> None:
    """GLUE-submission style: ``index<TAB>prediction`` (label names; 3 decimals for regression), each row's answer
    from :func:`bitfit_hf.inference.answers.classification_answer`, as ``bitfit-hf predict`` and the server give it."""
    import torch

    from bitfit_hf.inference.answers import classification_answer
    from bitfit_hf.utils.io import write_text_atomic

    problem_type = "regression" if spec.is_regression else "single_label_classification"
    lines = ["index\tprediction"]
    for index, row in enumerate(np.asarray(logits, dtype=np.float32).reshape(len(logits), -1)):
        best = classification_answer(torch.from_numpy(row), spec.id2label, problem_type, top_k=1)[0]
        lines.append(f"{index}\t{best['score']:3.3f}" if spec.is_regression else f"{index}\t{best['label']}")
    write_text_atomic(path, "\n".join(lines) + "\n")
