"""Turn one finished recipe run (its output directory) into the study's record of that cell.

The record holds what the report needs and nothing it would have to recompute from weights: the
validation and training-set scores in points, the per-epoch validation curve and the epochs it took
to converge, the training loss as logged (its last value says whether a run that evaluated only at the
end was still far from fitting), pure training time (``train_runtime`` minus the evaluations run inside training), peak
memory, the trainable-parameter summary and the bias-change matrix (Figure 1) when the run wrote one.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from bitfit_hf.study.grid import Cell
from bitfit_hf.utils.constants import BIAS_CHANGE_JSON, SUMMARY_NAME
from bitfit_hf.utils.io import read_json_object

__all__ = ["CONVERGED_WITHIN_POINTS", "read_outcome", "epochs_to_converge", "loss_curve"]

#: A run has converged at the first epoch whose validation score is within this many points of its best.
CONVERGED_WITHIN_POINTS = 1.0

ALL_RESULTS = "all_results.json"
TRAINER_STATE = "trainer_state.json"


def epochs_to_converge(curve: List[Tuple[float, float]], within: float = CONVERGED_WITHIN_POINTS) -> Optional[float]:
    """The first epoch of ``curve`` ((epoch, score in points) pairs) within ``within`` points of the
    best score; ``None`` for an empty curve."""
    if not curve:
        return None
    best = max(score for _, score in curve)
    return next(epoch for epoch, score in sorted(curve) if score >= best - within)


def _eval_curve(state: Optional[dict], metric_key: str, scale: float) -> Tuple[List[Tuple[float, float]], float]:
    """Per-epoch validation scores logged during training, and the seconds those evaluations took."""
    curve: List[Tuple[float, float]] = []
    eval_seconds = 0.0
    for entry in (state or {}).get("log_history", []):
        if metric_key in entry and "epoch" in entry:
            curve.append((round(float(entry["epoch"]), 3), float(entry[metric_key]) * scale))
            eval_seconds += float(entry.get("eval_runtime", 0.0))
    return curve, eval_seconds


def loss_curve(state: Optional[dict]) -> List[Tuple[float, float]]:
    """(epoch, training loss) of every logged training step, in order (the Trainer logs ``loss`` every
    ``logging_steps``)."""
    return [(round(float(e["epoch"]), 3), float(e["loss"])) for e in (state or {}).get("log_history", [])
            if "loss" in e and "epoch" in e]


def _trainable(summary: Optional[dict]) -> Optional[Dict[str, Any]]:
    if not summary:
        return None
    keys = ("total_params", "trainable_params", "trainable_fraction", "bias_params", "bias_fraction", "per_role")
    return {key: summary[key] for key in keys if key in summary}


def read_outcome(cell: Cell, run_dir: str, peak_rss_mb: Optional[float]) -> Dict[str, Any]:
    """The measured part of a finished cell's record (raises ValueError when the run left no score)."""
    task = cell.spec
    results = read_json_object(os.path.join(run_dir, ALL_RESULTS))
    if results is None:
        raise ValueError(f"the run wrote no {ALL_RESULTS} in {run_dir}")
    eval_key, train_key = f"eval_{task.metric}", f"predict_{task.metric}"
    if eval_key not in results:
        raise ValueError(f"{ALL_RESULTS} has no {eval_key} (keys: {', '.join(sorted(results))})")
    state = read_json_object(os.path.join(run_dir, TRAINER_STATE))
    curve, eval_seconds = _eval_curve(state, eval_key, task.scale)
    train_runtime = results.get("train_runtime")
    train_time = None if train_runtime is None else max(0.0, float(train_runtime) - eval_seconds)
    gpu_peak = results.get("train_mem_gpu_peaked_delta")
    gpu_alloc = results.get("train_mem_gpu_alloc_delta")
    bias_change = read_json_object(os.path.join(run_dir, BIAS_CHANGE_JSON))
    losses = loss_curve(state)
    return {
        "score": float(results[eval_key]) * task.scale,
        "train_score": float(results[train_key]) * task.scale if train_key in results else None,
        "metric": task.metric,
        "eval_curve": curve,
        "epochs_to_converge": epochs_to_converge(curve),
        "loss_curve": losses,
        "final_train_loss": losses[-1][1] if losses else None,
        "mean_train_loss": None if results.get("train_loss") is None else float(results["train_loss"]),
        "train_time_s": train_time,
        "train_runtime_s": None if train_runtime is None else float(train_runtime),
        "peak_rss_mb": peak_rss_mb,
        "gpu_train_peak_mb": None if gpu_peak is None else (float(gpu_peak) + float(gpu_alloc or 0)) / 2**20,
        "trainable": _trainable(read_json_object(os.path.join(run_dir, SUMMARY_NAME))),
        "bias_change": bias_change,
        "metrics": {k: v for k, v in results.items() if isinstance(v, (int, float, str))},
    }
