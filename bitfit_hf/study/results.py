"""The study's results: the cell records assembled into ``results.json``'s content (tables, constant
predictors, claim verdicts, the rules they were judged by, where the cells ran).

Separate from the markdown (:mod:`bitfit_hf.study.markdown`) so the numbers are computed once and both
``results.json`` and ``report.md`` state the same ones; everything comes from the records on disk, so it can be
rebuilt at any time.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Dict, Optional, Sequence

from bitfit_hf.study import claims as rules
from bitfit_hf.study.aggregate import aggregate, bias_change_over
from bitfit_hf.study.budgets import TASKS, Budget
from bitfit_hf.study.claims import COMBINE_RULE, figure1_ranking, judge_all
from bitfit_hf.study.compare import K_SE, MIN_SEEDS, NOISE_RULE
from bitfit_hf.study.gates import FIT_FRACTION, FIT_RULE, GATE_RULE, VALID_MARGIN, validity_table
from bitfit_hf.study.grid import StudySettings
from bitfit_hf.study.machine import cell_environments, environment
from bitfit_hf.study.state import CellState
from bitfit_hf.study.sweep import CHOICE_RULE
from bitfit_hf.utils.io import read_json_object, write_json_atomic

__all__ = ["build_results", "parameter_counts", "constant_predictors", "rule_texts"]

_COUNTS_CACHE = "param_counts.json"
_CONSTANTS_CACHE = "constants.json"


def parameter_counts(output_dir: str) -> Dict[str, Dict[str, float]]:
    """Claim 1's counts (cached in the study folder per transformers version: building BERT-large on
    the meta device takes seconds)."""
    import transformers

    from bitfit_hf.study.param_counts import count_published_models

    path = os.path.join(output_dir, _COUNTS_CACHE)
    cached = read_json_object(path)
    if cached and cached.get("transformers") == transformers.__version__:
        return cached["counts"]
    counts = count_published_models()
    write_json_atomic(path, {"transformers": transformers.__version__, "counts": counts})
    return counts


def constant_predictors(output_dir: str, budget: Budget, tasks: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Each task's constant-predictor scores on the examples its runs are scored on (cached in the study folder
    per slice: reading VitaminC takes seconds). A task whose data cannot be read gets ``{"error": ...}``."""
    from bitfit_hf.study.baselines import task_constants

    path = os.path.join(output_dir, _CONSTANTS_CACHE)
    cache = read_json_object(path) or {}
    out: Dict[str, Dict[str, Any]] = {}
    for task in tasks:
        spec, share = TASKS[task], budget.tasks[task]
        slices = (share.eval_samples, min(share.train_score_samples, share.train_size),
                  share.dev_samples if budget.sweep is not None else None)
        key = f"{task}|{spec.dataset}|" + "|".join(str(v) for v in slices)
        if key not in cache:
            try:
                cache[key] = task_constants(spec.recipe, spec.dataset, *slices)
            except Exception as err:  # noqa: BLE001 - a missing asset must not lose the rest of the report
                out[task] = {"error": f"{type(err).__name__}: {err}"}
                continue
        out[task] = cache[key]
    if cache:
        write_json_atomic(path, cache)
    return out


def rule_texts() -> Dict[str, Any]:
    """The rules every verdict was judged by, and their constants, as the report states them."""
    return {
        "gate": GATE_RULE,
        "fit": FIT_RULE,
        "noise": NOISE_RULE,
        "combine": COMBINE_RULE,
        "sweep": CHOICE_RULE,
        "constants": {
            "VALID_MARGIN": VALID_MARGIN, "FIT_FRACTION": FIT_FRACTION, "K_SE": K_SE, "MIN_SEEDS": MIN_SEEDS,
            **{name: getattr(rules, name) for name in ("MATCH_WITHIN", "SUBSET_NEARLY_WITHIN", "SINGLE_ROLE_WORSE_BY",
                                                       "FROZEN_WORSE_BY", "RANDOM_WORSE_BY", "GAP_SMALLER_BY")},
        },
    }


def build_results(
    states: Sequence[CellState],
    budget: Budget,
    settings: StudySettings,
    param_counts: Optional[Dict[str, Dict[str, float]]],
    constants: Optional[Dict[str, Dict[str, Any]]] = None,
) -> Dict[str, Any]:
    """``results.json``: the tables, the constant predictors, the verdicts and where they came from."""
    results = aggregate(states, budget)
    results["param_counts"] = param_counts
    results["constants"] = constants or {}
    results["claims"] = judge_all(results)
    results["rules"] = rule_texts()
    results["validity"] = validity_table(results["grid"], results.get("curve"), results["constants"])
    if results.get("curve"):  # the crossover the verdict used: over the sizes that pass the gate
        claim_3 = next(c for c in results["claims"] if c["id"] == 3)
        results["curve"]["crossover_size"] = claim_3["numbers"].get("crossover_size")
    claim_6 = next(c for c in results["claims"] if c["id"] == 6)  # the figure averages the tasks claim 6 could judge
    results["bias_change"] = bias_change_over(results.get("bias_change"), list(claim_6["numbers"].get("per_task") or ()))
    results["figure1_ranking"] = figure1_ranking(results.get("bias_change"))
    counts: Dict[str, int] = {}
    for state in states:
        counts[state.status] = counts.get(state.status, 0) + 1
    records = [s.record for s in states if s.record]
    results["study"] = {
        "budget": budget.name,
        "budget_description": budget.description,
        "model_name_or_path": settings.model_name_or_path or "sentence-transformers/all-MiniLM-L6-v2 (wheel)",
        "device": settings.device,
        "recipe_args": list(settings.recipe_args),
        "lr_scheduler_type": settings.lr_scheduler_type,
        "cells": counts,
        "cell_wall_s": sum(r.get("wall_s") or 0.0 for r in records),
        "cell_cpu_s": sum(r.get("cpu_s") or 0.0 for r in records),
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
        "cell_environments": cell_environments(records),
    }
    results["cells"] = [
        {"cell_id": s.cell_id, "stage": s.cell.stage, "task": s.cell.task, "method": s.cell.method,
         "train_size": s.cell.train_size, "seed": s.cell.seed, "learning_rate": s.cell.learning_rate, "status": s.status,
         **({k: s.record.get(k) for k in ("score", "train_score", "final_train_loss", "epochs_to_converge",
                                          "train_time_s", "peak_rss_mb", "wall_s", "error")}
            if s.record else {})}
        for s in states
    ]
    return results
