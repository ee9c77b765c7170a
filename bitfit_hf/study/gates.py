"""Validity gates: which runs a comparison may use, fixed here before any run.

A run that never left the constant prediction (every example the same class, every word the same tag)
says nothing about its method: comparing two such runs measures how each learning rate fared in a few
steps. So a comparison counts only when its runs beat the task's constant predictor
(:mod:`bitfit_hf.study.baselines`) by ``VALID_MARGIN`` points on every seed it uses, and a claim
about a generalisation gap only over runs that fit their training set (``FIT_FRACTION``).

"Its runs": both runs for a "matches" claim (BitFit matches full fine-tuning: a match with a run that
learned nothing is no match); at least one of the two for every other comparison ("all biases beat
the frozen encoder", "the subset is nearly as good"): a row the paper expects to be worse may sit at
the constant, that is the effect, but two rows at the constant say nothing.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

__all__ = [
    "VALID_MARGIN",
    "FIT_FRACTION",
    "GATE_RULE",
    "FIT_RULE",
    "BOTH",
    "EITHER",
    "constant_of",
    "threshold",
    "fit_threshold",
    "failures",
    "comparison_gate",
    "fit_gate",
    "validity_table",
]

#: A run is valid when its validation score exceeds the constant predictor's by more than this many points
#: on the same examples (about two binomial standard errors of an accuracy on 400 examples).
VALID_MARGIN = 5.0
#: A run fits its training set when its training-set score closes this fraction of the distance from the
#: constant predictor's training-set score to a perfect 100.
FIT_FRACTION = 0.8

BOTH = "both"
EITHER = "either"

GATE_RULE = (
    f"validity gate: a run is valid when its validation score is more than {VALID_MARGIN:g} points above the task's "
    "constant predictor on the same examples; a comparison counts only when, on every seed it uses, both runs are "
    "valid (the 'matches' claims 2 and 8) or at least one is (every other comparison: a row the paper expects to "
    "be worse may sit at the constant); otherwise that comparison is not testable here, with the run, seed and score"
)
FIT_RULE = (
    f"fit: a run fits its training set when its training-set score is at least constant + {FIT_FRACTION:g} x "
    "(100 - constant), the constant predictor's score on the same training examples"
)


def constant_of(constants: Optional[Mapping[str, Any]], task: str, split: str = "validation") -> Optional[float]:
    """The constant predictor's score on ``task``'s ``split`` (``validation``, ``train`` or ``dev``), if known."""
    part = ((constants or {}).get(task) or {}).get(split) or {}
    return part.get("score")


def threshold(constant: float) -> float:
    """The validation score a valid run must exceed."""
    return constant + VALID_MARGIN


def fit_threshold(constant_train: float) -> float:
    """The training-set score a run that fits must reach."""
    return constant_train + FIT_FRACTION * (100.0 - constant_train)


def failures(scores: Mapping[int, float], constant: float, seeds: Sequence[int]) -> List[str]:
    """``"seed S: X"`` for each of ``seeds`` whose score does not exceed the threshold (or is missing)."""
    out = []
    for seed in seeds:
        score = scores.get(seed)
        if score is None or score <= threshold(constant):
            out.append(f"seed {seed}: " + ("no score" if score is None else f"{score:.2f}"))
    return out


def comparison_gate(
    constants: Optional[Mapping[str, Any]],
    task: str,
    runs: Mapping[str, Mapping[int, float]],
    seeds: Sequence[int],
    need: str = BOTH,
) -> Optional[str]:
    """``None`` when the comparison of ``runs`` (label -> {seed: validation score}) on ``seeds`` counts, else
    the reason, naming each failing run, seed and score against the constant."""
    constant = constant_of(constants, task)
    if constant is None:
        return f"{task}: no constant-predictor score for its validation examples"
    failed: Dict[str, List[str]] = {label: failures(scores, constant, seeds) for label, scores in runs.items()}
    bad = [label for label, fails in failed.items() if fails]
    if need == BOTH and not bad:
        return None
    if need == EITHER and len(bad) < len(runs):
        return None
    detail = "; ".join(f"{label} {', '.join(failed[label])}" for label in bad)
    needed = "the run" if len(runs) == 1 else "both runs" if need == BOTH else "at least one run"
    return (f"{task}: {needed} must exceed the constant {constant:.2f} + {VALID_MARGIN:g} = {threshold(constant):.2f} "
            f"on every seed; {detail}")


def fit_gate(
    constants: Optional[Mapping[str, Any]],
    task: str,
    train_runs: Mapping[str, Mapping[int, float]],
    seeds: Sequence[int],
) -> Optional[str]:
    """``None`` when every run of ``train_runs`` (label -> {seed: training-set score}) fits on every seed."""
    constant = constant_of(constants, task, "train")
    if constant is None:
        return f"{task}: no constant-predictor score for its training-set examples"
    need = fit_threshold(constant)
    detail = []
    for label, scores in train_runs.items():
        short = [f"seed {s}: " + ("no score" if scores.get(s) is None else f"{scores[s]:.2f}") for s in seeds
                 if scores.get(s) is None or scores[s] < need]
        if short:
            detail.append(f"{label} {', '.join(short)}")
    if not detail:
        return None
    return f"{task}: training-set score below the fit threshold {need:.2f} (constant {constant:.2f}); " + "; ".join(detail)


def validity_table(grid: Mapping[str, Any], curve: Optional[Mapping[str, Any]],
                   constants: Optional[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Every finished run of the grid and the curve against its task's threshold: one row per (task, row,
    training size) with each seed's validation score, whether it is valid, and (grid rows) whether it fits."""
    out: List[Dict[str, Any]] = []

    def add(task: str, row: str, size: int, entry: Mapping[str, Any]) -> None:
        constant, constant_train = constant_of(constants, task), constant_of(constants, task, "train")
        runs = []
        for run in entry.get("runs", []):
            item = {"seed": run["seed"], "score": run["score"],
                    "valid": None if constant is None else run["score"] > threshold(constant)}
            if run.get("train_score") is not None and constant_train is not None:
                item["fits"] = run["train_score"] >= fit_threshold(constant_train)
            runs.append(item)
        if runs:
            out.append({"task": task, "row": row, "size": size, "constant": constant, "runs": runs})

    for task, entries in grid.items():
        for row, entry in entries.items():
            add(task, row, entry.get("train_size"), entry)
    grid_sizes = {(t, r, e.get("train_size")) for t, entries in grid.items() for r, e in entries.items()}
    for row, points in ((curve or {}).get("methods") or {}).items():
        for point in points:
            if (curve["task"], row, point["size"]) not in grid_sizes:
                add(curve["task"], row, point["size"], point)
    return out
