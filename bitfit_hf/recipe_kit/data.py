"""Turning a recipe's data arguments into datasets: an offline default (:mod:`bitfit_hf.data.offline`), a Hub
dataset or local files, and the split and column checks that fail before any training.

Every loader returns a :class:`datasets.DatasetDict` with the splits ``train``, ``validation``
and ``test`` (whichever exist; MNLI adds ``validation_mismatched`` / ``test_mismatched``).
"""

from __future__ import annotations

import csv
import json
import logging
import os
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from bitfit_hf.data.offline import OFFLINE_DATASETS, load_offline_dataset
from bitfit_hf.recipe_kit.errors import RecipeError

logger = logging.getLogger(__name__)

__all__ = [
    "load_raw_datasets",
    "load_data_file",
    "read_tsv",
    "require_split",
    "require_columns",
    "check_text_values",
    "report_cut",
    "diagnose_data_file",
    "split_source",
    "select_samples",
    "splits_in_use",
    "sample_limit",
]


# --------------------------------------------------------------------------- files


def read_tsv(path: str, fieldnames: Optional[Sequence[str]] = None) -> List[Dict[str, str]]:
    """Rows of a tab-separated file read verbatim (GLUE's TSVs hold unbalanced quotes: no quoting).

    The first line is the header unless ``fieldnames`` is given. Raises RecipeError on a row whose
    field count differs from the header's.
    """
    rows: List[Dict[str, str]] = []
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = list(fieldnames) if fieldnames is not None else None
        for lineno, record in enumerate(reader, start=1):
            if not record or (len(record) == 1 and not record[0].strip()):
                continue
            if header is None:
                header = [name.strip() for name in record]
                continue
            if len(record) != len(header):
                raise RecipeError(
                    f"{path}:{lineno}: {len(record)} tab-separated fields, but the header has {len(header)} "
                    f"({', '.join(header)})."
                )
            rows.append(dict(zip(header, record)))
    return rows


def _rows_to_dataset(rows: List[Dict[str, object]], path: str):
    import datasets

    if not rows:
        raise RecipeError(f"{path} holds no examples (empty split).")
    return datasets.Dataset.from_list(rows)


def load_data_file(
    path: str,
    split: str,
    native_reader: Optional[Callable[[str], Optional[object]]] = None,
    cache_dir: Optional[str] = None,
):
    """One split from a local file: the recipe's native format first, then csv / tsv / json / jsonl.

    ``native_reader(path)`` returns a Dataset when it recognises the file, else ``None``.
    """
    import datasets

    if not os.path.isfile(path):
        raise RecipeError(f"--{split}_file {path!r}: no such file.")
    if native_reader is not None:
        dataset = native_reader(path)
        if dataset is not None:
            return dataset
    extension = os.path.splitext(path)[1].lower()
    if extension == ".tsv":
        return _rows_to_dataset(read_tsv(path), path)
    builder = {".csv": "csv", ".json": "json", ".jsonl": "json"}.get(extension)
    if builder is None:
        raise RecipeError(
            f"--{split}_file {path!r}: unsupported file type {extension or '(none)'!r}. Use csv, tsv, json or jsonl"
            " (or this recipe's native format)."
        )
    try:
        loaded = datasets.load_dataset(builder, data_files={split: path}, cache_dir=cache_dir)
    except Exception as err:  # datasets raises many types for malformed files
        if "corresponds to no data" in str(err) or os.path.getsize(path) == 0:
            raise RecipeError(f"--{split}_file {path!r} holds no examples (empty split).") from None
        # datasets' own message ("An error occurred while generating the dataset") hides the cause: find it in
        # the file (the line, and the byte), else name the innermost exception.
        diagnose_data_file(path, builder, split)
        raise RecipeError(f"--{split}_file {path!r}: could not read it as {builder}: {_root_cause(err)}") from err
    return loaded[split]


def _root_cause(err: BaseException) -> str:
    while err.__cause__ is not None or (err.__context__ is not None and not err.__suppress_context__):
        err = err.__cause__ or err.__context__
    return f"{type(err).__name__}: {err}"


def diagnose_data_file(path: str, builder: str, split: str) -> None:
    """Raise a :class:`RecipeError` naming the first thing in ``path`` that a ``csv`` / ``json`` reader cannot
    take: a byte that is not UTF-8 (line and byte offset), a JSON line that does not parse or is not an object
    (file:line), a JSON document that does not parse (file:line, column). Returns when it finds nothing."""
    with open(path, "rb") as handle:
        data = handle.read()
    offset = 0
    for lineno, raw in enumerate(data.splitlines(keepends=True), start=1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as err:
            where = offset + err.start
            raise RecipeError(
                f"--{split}_file {path!r} is not UTF-8 text: line {lineno} (byte {where} of the file is "
                f"0x{data[where]:02x}). Save it as UTF-8, e.g. iconv -f latin1 -t utf-8 (if it is Latin-1)."
            ) from None
        offset += len(raw)
    if builder != "json":
        return
    text = data.decode("utf-8")
    stripped = text.lstrip("\ufeff \t\r\n")
    if not path.lower().endswith(".jsonl") and stripped.startswith("["):
        try:
            json.loads(stripped)
        except json.JSONDecodeError as err:
            line = text[: len(text) - len(stripped)].count("\n") + err.lineno
            raise RecipeError(f"{path}:{line}: not valid JSON ({err.msg}, column {err.colno}).") from None
        return
    if not path.lower().endswith(".jsonl"):
        try:
            json.loads(stripped)
            return  # one JSON document
        except json.JSONDecodeError:
            pass  # JSON lines, then
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise RecipeError(f"{path}:{lineno}: not valid JSON ({err.msg}, column {err.colno}).") from None
        if not isinstance(record, dict):
            raise RecipeError(f"{path}:{lineno}: a JSON line must be an object ({{\"column\": value, ...}}), this one is "
                              f"a {type(record).__name__}.")


def split_source(data_args, split: str) -> Optional[str]:
    """The local file a split was read from (``None``: a Hub or offline dataset)."""
    files = {"train": getattr(data_args, "train_file", None), "validation": getattr(data_args, "validation_file", None),
             "test": getattr(data_args, "test_file", None),
             "validation_mismatched": getattr(data_args, "validation_mismatched_file", None),
             "test_mismatched": getattr(data_args, "test_mismatched_file", None)}
    predict_split = getattr(data_args, "predict_split", None) or "test"
    if split == "test" and predict_split != "test":
        return files.get(predict_split)
    return files.get(split)


def _json_lines_records(path: str):
    """``(line number, parsed record or None)`` of each non-blank line of a JSON-lines file, in order."""
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    yield lineno, json.loads(line)
                except ValueError:
                    yield lineno, None


def _is_json_lines(path: str) -> bool:
    if path.lower().endswith(".jsonl"):
        return True
    if not path.lower().endswith(".json"):
        return False
    try:
        with open(path, encoding="utf-8") as handle:
            json.load(handle)
        return False  # one JSON document (an array of records)
    except (ValueError, OSError):
        return True


def check_text_values(dataset, split: str, columns, source: Optional[str] = None, flags: Optional[Dict] = None) -> None:
    """Every value of ``columns`` in ``dataset`` is a string; else a :class:`RecipeError` naming where: the file
    and line for JSON lines (``train.jsonl:3: no 'text' field``), the row of a CSV or of a Hub / offline split.
    ``flags``: the flag behind each column, added to the message (``--text_column_name text``)."""
    for column in columns:
        if column is None:
            continue
        for row, value in enumerate(dataset[column]):
            if isinstance(value, str):
                continue
            flag = f" ({flags[column]})" if flags and column in flags else ""
            what = f"{column!r} is null, not a text" if value is None else \
                f"{column!r} is a {type(value).__name__} ({value!r:.40}), not a text"
            if source and _is_json_lines(source):
                for index, (lineno, record) in enumerate(_json_lines_records(source)):
                    if index == row:
                        if isinstance(record, dict) and column not in record:
                            what = f"no {column!r} field"
                        raise RecipeError(f"{source}:{lineno}: {what}{flag}.")
            where = f"{source}, row {row + 1}" if source else f"the {split!r} split, row {row + 1}"
            if value is None:
                what = f"{column!r} is empty (or null), not a text"
            raise RecipeError(f"{where}: {what}{flag}.")


def load_raw_datasets(
    data_args,
    model_args=None,
    native_reader: Optional[Callable[[str], Optional[object]]] = None,
    extra_files: Optional[Dict[str, Optional[str]]] = None,
    hub_default: Optional[tuple] = None,
):
    """Load the splits from an offline dataset, the Hub, or local files (in that order of precedence).

    Args:
        data_args: a :class:`~bitfit_hf.recipe_kit.args.DataArguments`.
        model_args: for ``cache_dir`` and ``token``.
        native_reader: the recipe's reader for its native file format.
        extra_files: more local splits, e.g. ``{"validation_mismatched": path}``.
        hub_default: ``(name, config)`` to load from the Hub when no data source is given
            (GLUE: ``("nyu-mll/glue", task_name)``).
    """
    import datasets

    cache_dir = getattr(model_args, "cache_dir", None)
    token = getattr(model_args, "token", None)
    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    files.update(extra_files or {})
    files = {split: path for split, path in files.items() if path}

    name, config = data_args.dataset_name, data_args.dataset_config_name
    if name is None and not files and hub_default is not None:
        name, config = hub_default
    if name in OFFLINE_DATASETS:
        raw = load_offline_dataset(name)
    elif name is not None:
        try:
            raw = datasets.load_dataset(name, config, cache_dir=cache_dir, token=token)
        except Exception as err:
            raise RecipeError(
                f"could not load the dataset {name!r}{f' ({config})' if config else ''} from the Hub: {err}\n"
                f"Without network access use local files (--train_file/--validation_file/--test_file) or an offline "
                f"dataset: {', '.join(OFFLINE_DATASETS)} (bitfit-hf assets fetch)."
            ) from err
        if not isinstance(raw, datasets.DatasetDict):
            raw = datasets.DatasetDict(train=raw)
    else:
        raw = datasets.DatasetDict()
    # local files add to (or replace) the splits of a named dataset
    for split, path in files.items():
        raw[split] = load_data_file(path, split, native_reader, cache_dir)
    if not len(raw):
        raise RecipeError("no data: give --dataset_name, or --train_file / --validation_file / --test_file.")
    dev_size = getattr(data_args, "dev_split_from_train", None)
    if dev_size:
        raw = carve_dev_split(raw, dev_size)
    predict_split = getattr(data_args, "predict_split", None) or "test"
    if predict_split != "test":
        if predict_split not in raw:
            raise RecipeError(
                f"--predict_split {predict_split}: the data has no such split (it has {', '.join(raw.keys())})."
            )
        raw["test"] = raw[predict_split]  # --do_predict then scores (the first N of) that split
    return raw


def carve_dev_split(raw, size: int):
    """Evaluate on the *last* ``size`` training examples instead of the validation split, and train on
    the rest: learning rates and other choices are then made without ever seeing the reported
    validation set. The first training examples stay first, so ``--max_train_samples N`` trains on the
    same N examples with or without the carve."""
    if "train" not in raw:
        raise RecipeError("--dev_split_from_train carves the evaluation set out of the training data: give training data.")
    train = raw["train"]
    if not 0 < size < len(train):
        raise RecipeError(f"--dev_split_from_train {size}: the training split has {len(train)} examples; carve fewer "
                          "than that (and more than 0).")
    logger.info("Evaluating on the last %d training examples (--dev_split_from_train); the validation split is not "
                "used.", size)
    raw["validation"] = train.select(range(len(train) - size, len(train)))
    raw["train"] = train.select(range(len(train) - size))
    return raw


# --------------------------------------------------------------------------- checks


def require_split(raw, split: str, flag: str, file_flag: str) -> None:
    """``raw[split]`` must exist and hold at least one example (needed by ``flag``)."""
    if split not in raw:
        have = ", ".join(raw.keys()) or "none"
        raise RecipeError(
            f"{flag} needs a {split!r} split, but the data has only: {have}. Pass {file_flag}, or a dataset with "
            f"a {split} split."
        )
    if len(raw[split]) == 0:
        raise RecipeError(f"the {split!r} split is empty: {flag} has nothing to work on.")


# split -> (TrainingArguments field that asks for it, its flag, the file flag that provides it)
_SPLIT_FLAGS = {
    "train": ("do_train", "--do_train", "--train_file"),
    "validation": ("do_eval", "--do_eval", "--validation_file"),
    "test": ("do_predict", "--do_predict", "--test_file"),
}


def splits_in_use(raw, training_args) -> Dict[str, bool]:
    """Which of train / validation / test the run uses (``--do_train`` / ``--do_eval`` / ``--do_predict``);
    each one used is checked to exist and be non-empty, so a missing split fails before any training."""
    used = {split: bool(getattr(training_args, attr)) for split, (attr, _, _) in _SPLIT_FLAGS.items()}
    for split, (_, flag, file_flag) in _SPLIT_FLAGS.items():
        if used[split]:
            require_split(raw, split, flag, file_flag)
    return used


def sample_limit(data_args, split: str) -> Optional[int]:
    """``--max_train_samples`` / ``--max_eval_samples`` / ``--max_predict_samples`` for ``split``
    (``validation_mismatched`` counts as validation, ``test_mismatched`` as test)."""
    field_name = {"train": "max_train_samples", "validation": "max_eval_samples", "test": "max_predict_samples"}
    return getattr(data_args, field_name[split.split("_")[0]])


def require_columns(dataset, split: str, columns: Iterable[Optional[str]], what: str = "") -> None:
    """Every name in ``columns`` (``None`` entries skipped) must be a column of ``dataset``."""
    have = list(dataset.column_names)
    missing = [c for c in columns if c is not None and c not in have]
    if missing:
        raise RecipeError(
            f"the {split!r} split has no column {', '.join(repr(m) for m in missing)}{(' ' + what) if what else ''}; "
            f"its columns are: {', '.join(have) or 'none'}."
        )


def report_cut(dataset, split: str, limit: str):
    """Report what tokenising cut, and drop the marker columns: ``cut`` (an example longer than ``limit``, e.g.
    ``"--max_seq_length 128"``, lost its end) and ``no_target`` (instruction data: no response token left, so
    the example trains nothing). A warning counts them; a split where no example keeps a target is an error."""
    columns = [c for c in ("cut", "no_target") if c in dataset.column_names]
    if not columns:
        return dataset
    total = len(dataset)
    cut = sum(map(bool, dataset["cut"])) if "cut" in columns else 0
    empty = sum(map(bool, dataset["no_target"])) if "no_target" in columns else 0
    if total and empty == total:
        raise RecipeError(f"none of the {total} examples of the {split} split keeps a response token within {limit}: "
                          "each prompt fills the whole block, so there is nothing to learn. Raise it, or shorten the "
                          "prompts.")
    if cut:
        message = f"{cut} of {total} examples of the {split} split were cut at {limit} (their ends are not used)"
        if empty:
            message += f"; {empty} of them kept no response token ({'it trains' if empty == 1 else 'they train'} nothing)"
        logger.warning("%s. Raise it to keep them whole.", message)
    return dataset.remove_columns(columns)


def select_samples(dataset, max_samples: Optional[int], split: str):
    """The first ``max_samples`` examples (None or a negative number: all). Raises on 0."""
    if max_samples is None or max_samples < 0 or max_samples >= len(dataset):
        return dataset
    if max_samples == 0:
        flag = "train" if split == "train" else "eval" if split.startswith("validation") else "predict"
        raise RecipeError(f"--max_{flag}_samples 0 leaves the {split!r} split empty.")
    return dataset.select(range(max_samples))
