"""The paper's claims 1-8 and the rule that judges each one, fixed here before any run.

Every judgment is one of ``reproduced``, ``not reproduced`` or ``not testable here`` and carries the
numbers that decided it. The rules work on the aggregated tables (:mod:`bitfit_hf.study.aggregate`),
so they can be checked on hand-made results. Differences are in points (accuracy x 100, F1) and use
the mean over seeds; where a claim spans tasks, the tasks are averaged with equal weight.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

__all__ = [
    "REPRODUCED",
    "NOT_REPRODUCED",
    "NOT_TESTABLE",
    "PUBLISHED_PERCENT",
    "MATCH_WITHIN",
    "SUBSET_NEARLY_WITHIN",
    "SINGLE_ROLE_WORSE_BY",
    "FROZEN_WORSE_BY",
    "RANDOM_WORSE_BY",
    "GAP_SMALLER_BY",
    "CLAIMS",
    "judge_all",
]

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_TESTABLE = "not testable here"

# ---- the rules -------------------------------------------------------------------------------------
#: Claim 1: the counted percentage, rounded to two decimals, equals the paper's.
PUBLISHED_PERCENT = {"bert-base": 0.09, "bert-large": 0.08}
#: Claims 2 and 8: BitFit "matches" full fine-tuning when it is at most this many points below it.
MATCH_WITHIN = 1.0
#: Claim 4: b_q + b_m2 is "nearly as good" as all biases when at most this many points below.
SUBSET_NEARLY_WITHIN = 1.5
#: Claim 4: b_q alone and b_m2 alone are "clearly worse" when each is at least this many points below b_q + b_m2.
SINGLE_ROLE_WORSE_BY = 1.0
#: Claim 4: frozen (head only) is "much worse" when at least this many points below all biases.
FROZEN_WORSE_BY = 5.0
#: Claim 5: a random subset of the same size is "clearly worse" when at least this many points below all biases.
RANDOM_WORSE_BY = 2.0
#: Claim 7: BitFit's train-minus-validation gap is smaller when at least this many points below full's.
GAP_SMALLER_BY = 1.0
#: Claim 6: the roles ranked (Figure 1's per-layer average change).
FIGURE1_ROLES = ("b_q", "b_k", "b_v", "b_m1", "b_LN1", "b_m2", "b_m3", "b_LN2")

CLAIMS = {
    1: "BitFit trains ~0.09% (BERT-base) / ~0.08% (BERT-large) of the parameters",
    2: "on small-to-medium data BitFit matches full fine-tuning (sometimes beats it)",
    3: "training-set size: BitFit wins with little data, full fine-tuning overtakes it as data grows",
    4: "b_q + b_m2 alone is nearly as good as all biases; either alone is clearly worse; frozen (head only) is much worse",
    5: "random subsets of the same size (rand uniform, rand row/col) are clearly worse than the biases",
    6: "b_q and b_m2 change most during training, b_k barely at all (Figure 1)",
    7: "BitFit's generalisation gap (train minus validation score) is smaller than full fine-tuning's",
    8: "token-level POS tagging: BitFit is about as good as full fine-tuning",
}

RULES = {
    1: "bias parameters / all parameters of the bare encoder, rounded to 2 decimals, equals "
       + " and ".join(f"{v:.2f}% ({k})" for k, v in PUBLISHED_PERCENT.items()),
    2: f"mean over tasks of (BitFit - full) >= -{MATCH_WITHIN:g} point",
    3: "on the curve task, BitFit - full > 0 at the smallest size and < 0 at the largest (the crossover "
       "is where the difference changes sign)",
    4: f"mean over tasks: all - (b_q+b_m2) <= {SUBSET_NEARLY_WITHIN:g}; (b_q+b_m2) - b_q >= {SINGLE_ROLE_WORSE_BY:g} "
       f"and (b_q+b_m2) - b_m2 >= {SINGLE_ROLE_WORSE_BY:g}; all - frozen >= {FROZEN_WORSE_BY:g} points",
    5: f"mean over tasks: all - rand_uniform >= {RANDOM_WORSE_BY:g} and all - rand_row_col >= {RANDOM_WORSE_BY:g} points",
    6: "in the task-averaged Figure-1 ranking of " + ", ".join(FIGURE1_ROLES)
       + " by mean change per layer, the top two are b_q and b_m2 and b_k is last",
    7: f"mean over tasks of gap(full) - gap(BitFit) >= {GAP_SMALLER_BY:g} points (gap = training-set score - "
       "validation score)",
    8: f"on POS, BitFit - full >= -{MATCH_WITHIN:g} point",
}


def _verdict(number: int, verdict: str, evidence: str, numbers: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return {"id": number, "claim": CLAIMS[number], "rule": RULES[number], "verdict": verdict,
            "evidence": evidence, "numbers": numbers or {}}


def _mean(grid: Dict[str, Any], task: str, method: str, field: str = "score") -> Optional[float]:
    entry = grid.get(task, {}).get(method)
    if not entry:
        return None
    return (entry.get(field) or {}).get("mean")


def _status(grid: Dict[str, Any], task: str, method: str) -> str:
    entry = grid.get(task, {}).get(method)
    return "not in this budget" if entry is None else entry.get("status", "?")


def _missing(grid: Dict[str, Any], methods: Sequence[str], tasks: Sequence[str]) -> str:
    reasons = []
    for method in methods:
        statuses = {_status(grid, t, method) for t in tasks} if tasks else {"not in this budget"}
        reasons.append(f"{method}: {'; '.join(sorted(statuses))}")
    return "; ".join(reasons)


def _tasks_with(grid: Dict[str, Any], methods: Sequence[str], field: str = "score") -> List[str]:
    return [t for t in grid if all(_mean(grid, t, m, field) is not None for m in methods)]


def _fmt(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def claim_1(param_counts: Optional[Dict[str, Dict[str, float]]]) -> Dict[str, Any]:
    if not param_counts or any(name not in param_counts for name in PUBLISHED_PERCENT):
        return _verdict(1, NOT_TESTABLE, "no parameter counts")
    got = {name: param_counts[name]["all_percent"] for name in PUBLISHED_PERCENT}
    ok = all(round(got[name], 2) == published for name, published in PUBLISHED_PERCENT.items())
    evidence = "; ".join(
        f"{name}: {int(param_counts[name]['all_bias_params']):,} of {int(param_counts[name]['total_params']):,} "
        f"= {got[name]:.4f}%" for name in PUBLISHED_PERCENT
    )
    return _verdict(1, REPRODUCED if ok else NOT_REPRODUCED, evidence, {"percent": got})


def _average_difference(grid, tasks, first, second, field="score"):
    diffs = {t: _mean(grid, t, first, field) - _mean(grid, t, second, field) for t in tasks}
    return sum(diffs.values()) / len(diffs), diffs


def claim_2(grid: Dict[str, Any]) -> Dict[str, Any]:
    tasks = _tasks_with(grid, ("bitfit", "full"))
    if not tasks:
        return _verdict(2, NOT_TESTABLE, "no task has both BitFit and full fine-tuning results ("
                        + _missing(grid, ("bitfit", "full"), list(grid)) + ")")
    average, diffs = _average_difference(grid, tasks, "bitfit", "full")
    ok = average >= -MATCH_WITHIN
    evidence = f"BitFit - full: mean {_fmt(average)} points over {len(tasks)} task(s) (" + ", ".join(
        f"{t} {_fmt(d)}" for t, d in diffs.items()) + ")"
    return _verdict(2, REPRODUCED if ok else NOT_REPRODUCED, evidence, {"mean_difference": average, "per_task": diffs})


def claim_3(curve: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    points = [p for p in (curve or {}).get("differences", []) if p.get("difference") is not None]
    if len(points) < 2:
        return _verdict(3, NOT_TESTABLE, "fewer than two training sizes with both BitFit and full fine-tuning")
    small, large = points[0], points[-1]
    ok = small["difference"] > 0 and large["difference"] < 0
    crossover = curve.get("crossover_size")
    evidence = (f"{curve['task']}: BitFit - full = {_fmt(small['difference'])} at n={small['size']}, "
                f"{_fmt(large['difference'])} at n={large['size']}; "
                + (f"crossover at n~{crossover:.0f}" if crossover else "no crossover within the sizes run"))
    return _verdict(3, REPRODUCED if ok else NOT_REPRODUCED, evidence,
                    {"differences": points, "crossover_size": crossover})


def claim_4(grid: Dict[str, Any]) -> Dict[str, Any]:
    rows = ("bitfit", "paper_subset", "b_q", "b_m2", "frozen")
    tasks = _tasks_with(grid, rows)
    if not tasks:
        return _verdict(4, NOT_TESTABLE, "no task has all of " + ", ".join(rows) + " ("
                        + _missing(grid, rows, list(grid)) + ")")
    subset_gap, _ = _average_difference(grid, tasks, "bitfit", "paper_subset")
    q_gap, _ = _average_difference(grid, tasks, "paper_subset", "b_q")
    m2_gap, _ = _average_difference(grid, tasks, "paper_subset", "b_m2")
    frozen_gap, _ = _average_difference(grid, tasks, "bitfit", "frozen")
    checks = {
        "all - (b_q+b_m2)": (subset_gap, subset_gap <= SUBSET_NEARLY_WITHIN),
        "(b_q+b_m2) - b_q": (q_gap, q_gap >= SINGLE_ROLE_WORSE_BY),
        "(b_q+b_m2) - b_m2": (m2_gap, m2_gap >= SINGLE_ROLE_WORSE_BY),
        "all - frozen": (frozen_gap, frozen_gap >= FROZEN_WORSE_BY),
    }
    ok = all(passed for _, passed in checks.values())
    evidence = f"over {', '.join(tasks)}: " + "; ".join(
        f"{name} = {_fmt(value)}{'' if passed else ' (fails)'}" for name, (value, passed) in checks.items())
    return _verdict(4, REPRODUCED if ok else NOT_REPRODUCED, evidence,
                    {name: value for name, (value, _) in checks.items()})


def claim_5(grid: Dict[str, Any]) -> Dict[str, Any]:
    rows = ("bitfit", "rand_uniform", "rand_row_col")
    tasks = _tasks_with(grid, rows)
    if not tasks:
        return _verdict(5, NOT_TESTABLE, _missing(grid, ("rand_uniform", "rand_row_col"), list(grid)))
    uniform, _ = _average_difference(grid, tasks, "bitfit", "rand_uniform")
    row_col, _ = _average_difference(grid, tasks, "bitfit", "rand_row_col")
    ok = uniform >= RANDOM_WORSE_BY and row_col >= RANDOM_WORSE_BY
    evidence = f"over {', '.join(tasks)}: all - rand_uniform = {_fmt(uniform)}, all - rand_row_col = {_fmt(row_col)}"
    return _verdict(5, REPRODUCED if ok else NOT_REPRODUCED, evidence,
                    {"all_minus_rand_uniform": uniform, "all_minus_rand_row_col": row_col})


def figure1_ranking(bias_change: Optional[Dict[str, Any]]) -> List[tuple]:
    """(role, mean change per layer) for the paper's in-layer roles, largest first."""
    if not bias_change:
        return []
    matrix = bias_change["matrix"]
    averages = dict(zip(matrix["roles"], matrix["average"]))
    ranked = [(role, averages[role]) for role in FIGURE1_ROLES if averages.get(role) is not None]
    return sorted(ranked, key=lambda item: -item[1])


def claim_6(bias_change: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    ranking = figure1_ranking(bias_change)
    if len(ranking) < 3 or "b_k" not in dict(ranking):
        return _verdict(6, NOT_TESTABLE, "no bias-change matrix from a BitFit (all biases) run with b_q, b_k, b_m2")
    top_two = {role for role, _ in ranking[:2]}
    ok = top_two == {"b_q", "b_m2"} and ranking[-1][0] == "b_k"
    evidence = (f"ranking over {', '.join(bias_change['tasks'])} ({bias_change['runs']} runs): "
                + " > ".join(f"{role} {value:.2e}" for role, value in ranking))
    return _verdict(6, REPRODUCED if ok else NOT_REPRODUCED, evidence, {"ranking": ranking})


def claim_7(grid: Dict[str, Any]) -> Dict[str, Any]:
    tasks = _tasks_with(grid, ("bitfit", "full"), field="gap")
    if not tasks:
        return _verdict(7, NOT_TESTABLE, "no task has training-set scores for both BitFit and full fine-tuning")
    difference, per_task = _average_difference(grid, tasks, "full", "bitfit", field="gap")
    ok = difference >= GAP_SMALLER_BY
    evidence = f"gap(full) - gap(BitFit): mean {_fmt(difference)} points (" + ", ".join(
        f"{t}: BitFit {_mean(grid, t, 'bitfit', 'gap'):.2f}, full {_mean(grid, t, 'full', 'gap'):.2f}" for t in tasks) + ")"
    return _verdict(7, REPRODUCED if ok else NOT_REPRODUCED, evidence,
                    {"mean_difference": difference, "per_task": per_task})


def claim_8(grid: Dict[str, Any]) -> Dict[str, Any]:
    if "pos" not in _tasks_with(grid, ("bitfit", "full")):
        return _verdict(8, NOT_TESTABLE, "POS: " + _missing(grid, ("bitfit", "full"), ["pos"]))
    bitfit, full = _mean(grid, "pos", "bitfit"), _mean(grid, "pos", "full")
    ok = bitfit - full >= -MATCH_WITHIN
    evidence = f"POS token accuracy: BitFit {bitfit:.2f}, full {full:.2f} (difference {_fmt(bitfit - full)})"
    return _verdict(8, REPRODUCED if ok else NOT_REPRODUCED, evidence, {"bitfit": bitfit, "full": full})


def judge_all(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The eight verdicts from the aggregated ``results`` (with ``param_counts`` for claim 1)."""
    grid = results.get("grid") or {}
    return [
        claim_1(results.get("param_counts")),
        claim_2(grid),
        claim_3(results.get("curve")),
        claim_4(grid),
        claim_5(grid),
        claim_6(results.get("bias_change")),
        claim_7(grid),
        claim_8(grid),
    ]
