"""Evaluation results for the model card: read from the trainer's metric files or log history, and
turned into ``(split, metric, value)`` rows.

Separate from :mod:`bitfit_hf.reporting.model_card` because it parses trainer output rather than
building a card: the Hub push, the trainer and ``bitfit-hf info`` read metrics with it too.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

logger = logging.getLogger(__name__)

EVAL_RESULTS_FILES = ("all_results.json", "eval_results.json", "test_results.json")
_NOT_METRICS = ("runtime", "samples_per_second", "steps_per_second", "compilation_time", "total_flos", "flos",
                "epoch", "step", "samples", "num_tokens", "preparation_time", "num_input_tokens_seen")
_SPLITS = {"eval": "validation", "test": "test", "predict": "test", "train": "train"}
_BEFORE_TRAINING_PREFIX = "init_eval_"
BEFORE_TRAINING = " (before training)"  # split suffix of those rows: in the card's table, not its model-index


def read_eval_results(directory: Optional[str]) -> Dict[str, float]:
    """Metrics written by ``trainer.save_metrics`` (``all_results.json``, ``eval_results.json``, ...)."""
    results: Dict[str, float] = {}
    if not directory:
        return results
    for name in reversed(EVAL_RESULTS_FILES):  # all_results.json last: it wins
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as handle:
                    data = json.load(handle)
            except (OSError, json.JSONDecodeError) as err:
                logger.warning("Ignoring %s: %s", path, err)
                continue
            if isinstance(data, dict):
                results.update({k: v for k, v in data.items() if _is_number(v)})
    return results


def eval_results_from_log_history(log_history: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
    """The latest value of every ``eval_*`` / ``test_*`` metric in ``trainer.state.log_history``."""
    results: Dict[str, float] = {}
    for entry in log_history or []:
        for key, value in entry.items():
            if key.startswith(("eval_", "test_")) and _is_number(value):
                results[key] = value
    return results


def eval_rows(eval_results: Union[None, Mapping[str, Any]], default_split: str = "validation") -> List[Tuple[str, str, float]]:
    """``(split, metric, value)`` rows from trainer-style metrics (``eval_accuracy``) or
    ``{split: {metric: value}}``; speed, epoch and size entries are dropped."""
    rows: List[Tuple[str, str, float]] = []
    if not eval_results:
        return rows
    for key, value in eval_results.items():
        if isinstance(value, Mapping):
            rows.extend((str(key), m, float(v)) for m, v in value.items() if _is_number(v) and not _skip_metric(m))
            continue
        if not _is_number(value):
            continue
        prefix, _, metric = str(key).partition("_")
        if prefix == "probe":  # the probe head start's own figures (train_results.json): not an evaluation
            continue
        if str(key).startswith(_BEFORE_TRAINING_PREFIX):  # the recipes' evaluation of the untrained model
            split, metric = f"{default_split}{BEFORE_TRAINING}", str(key)[len(_BEFORE_TRAINING_PREFIX):]
        elif prefix in _SPLITS and metric:
            split = default_split if prefix == "eval" else _SPLITS[prefix]
        else:
            split, metric = default_split, str(key)
        if _skip_metric(metric) or (split == "train" and metric != "loss"):
            continue
        rows.append((split, metric, float(value)))
    order = {"train": 3, "validation": 0, f"validation{BEFORE_TRAINING}": 1, "test": 2}
    rows.sort(key=lambda r: (order.get(r[0], 3), r[0], r[1] == "loss", r[1]))
    return rows


def _skip_metric(metric: str) -> bool:
    return metric.endswith(_NOT_METRICS) or "_mem_" in metric or metric.startswith("mem_")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))
