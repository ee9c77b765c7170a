"""The paper's claims 1-8 and the rule that judges each one, fixed here before any run.

Every judgment is one of ``reproduced``, ``not reproduced`` or ``not testable here`` and carries the
numbers that decided it. The rules work on the aggregated tables (:mod:`bitfit_hf.study.aggregate`) and
the constant predictors (:mod:`bitfit_hf.study.baselines`), so they can be checked on hand-made results.
Scores are in points (accuracy x 100, SQuAD F1).

Each comparison is made per task, seed by seed (:mod:`bitfit_hf.study.compare`), only on runs that pass
the validity gate (:mod:`bitfit_hf.study.gates`); a claim that spans tasks is then combined by
``COMBINE_RULE`` (claim 6 by its own count of tasks), never by averaging tasks trained at different rates.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from bitfit_hf.study.aggregate import find_crossover
from bitfit_hf.study.compare import FAILS, HOLDS, UNDECIDED, Paired, at_most, by_seed, exceeds, paired, within
from bitfit_hf.study.gates import BOTH, EITHER, FIT_RULE, comparison_gate, fit_gate

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
    "FIGURE1_ROLES",
    "CLAIMS",
    "RULES",
    "COMBINE_RULE",
    "figure1_ranking",
    "judge_all",
]

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_TESTABLE = "not testable here"
NOT_JUDGED = "not testable"  # a task's comparison that did not pass its gate (or lacks runs)

# ---- the rules -------------------------------------------------------------------------------------
#: Claim 1: the counted percentage, rounded to two decimals, equals the paper's.
PUBLISHED_PERCENT = {"bert-base": 0.09, "bert-large": 0.08}
#: Claims 2 and 8: BitFit "matches" full fine-tuning when BitFit - full lies within +- this many points
#: (the paper's per-task BitFit - full differences on GLUE are within about 2 points).
MATCH_WITHIN = 2.0
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

COMBINE_RULE = (
    "over tasks (claims 2, 4, 5, 7): a claim is judged in each task where its comparisons pass the validity gate; "
    "reproduced when it holds in at least one such task and fails in none, not reproduced when it fails in any, "
    "not testable here when it is decided in no task (every task failed the gate, or seed noise left it undecided); "
    "a task's claim with several parts holds when every part holds and fails when any part fails"
)

RULES = {
    1: "bias parameters / all parameters of the bare encoder, rounded to 2 decimals, equals "
       + " and ".join(f"{v:.2f}% ({k})" for k, v in PUBLISHED_PERCENT.items()),
    2: f"per task, BitFit and full fine-tuning both valid: BitFit - full within ±{MATCH_WITHIN:g} points, two-sided "
       "(holds when the whole interval lies inside, fails when it lies wholly outside)",
    3: "on the curve task (SQuAD training subsets of growing size, as the paper's Figure 2), at each size where BitFit or "
       "full fine-tuning is valid on every seed: BitFit - full; reproduced when BitFit is ahead at the smallest such size "
       "and behind at the largest (each interval excluding 0); not reproduced when BitFit is not ahead at the smallest "
       "(interval at or below 0) or full fine-tuning is not ahead at the largest; the crossover is where the mean "
       "difference changes sign from + to - (interpolated in log size; a difference of exactly 0, a tie, is no change "
       "of sign)",
    4: f"per task: all - (b_q+b_m2) <= {SUBSET_NEARLY_WITHIN:g} (the whole interval); (b_q+b_m2) - b_q >= "
       f"{SINGLE_ROLE_WORSE_BY:g} and (b_q+b_m2) - b_m2 >= {SINGLE_ROLE_WORSE_BY:g}; all - frozen >= "
       f"{FROZEN_WORSE_BY:g} points (each: the mean reaches the bound and the interval excludes 0)",
    5: f"per task: all - rand_uniform >= {RANDOM_WORSE_BY:g} and all - rand_row_col >= {RANDOM_WORSE_BY:g} points "
       "(the mean reaches the bound and the interval excludes 0)",
    6: "per task whose BitFit (all biases) runs are valid on every seed (other tasks skipped): rank "
       + ", ".join(FIGURE1_ROLES) + " by mean change per layer (seeds averaged); the claim holds in a task when the top "
       "two are b_q and b_m2 and b_k is last; reproduced when it holds in more than half of the judged tasks",
    7: f"per task where BitFit and full fine-tuning are valid and fit their training set on every seed ({FIT_RULE}): "
       f"gap(full) - gap(BitFit) >= {GAP_SMALLER_BY:g} point (the mean reaches it and the interval excludes 0; gap = "
       "training-set score - validation score)",
    8: f"on POS, both runs valid: BitFit - full within ±{MATCH_WITHIN:g} points, two-sided, as claim 2",
}

_LABELS = {"bitfit": "all", "paper_subset": "(b_q+b_m2)", "b_q": "b_q", "b_m2": "b_m2", "frozen": "frozen",
           "full": "full", "rand_uniform": "rand_uniform", "rand_row_col": "rand_row_col"}


def _verdict(number: int, verdict: str, evidence: str, numbers: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return {"id": number, "claim": CLAIMS[number], "rule": RULES[number], "verdict": verdict,
            "evidence": evidence, "numbers": numbers or {}}


# ---- one comparison on one task ---------------------------------------------------------------------


def _entry(grid: Mapping[str, Any], task: str, row: str) -> Optional[Mapping[str, Any]]:
    return (grid.get(task) or {}).get(row)


def _missing(grid: Mapping[str, Any], task: str, rows: Sequence[str]) -> Optional[str]:
    """Why ``rows`` cannot be compared on ``task`` (not in the budget, not available, failed, too few seeds)."""
    reasons = []
    for row in rows:
        entry = _entry(grid, task, row)
        if entry is None:
            reasons.append(f"{row}: not in this budget")
        elif not entry.get("runs"):
            reasons.append(f"{row}: {entry.get('status', 'no finished run')}")
    return f"{task}: " + "; ".join(reasons) if reasons else None


def _gaps(entry: Mapping[str, Any]) -> Dict[int, float]:
    return {int(r["seed"]): float(r["train_score"]) - float(r["score"]) for r in entry.get("runs", [])
            if r.get("train_score") is not None}


def _compare(results: Mapping[str, Any], task: str, a: str, b: str, test: Callable[[Paired], str], need: str,
             gap: bool = False) -> Dict[str, Any]:
    """One part of a claim on one task: ``a - b`` paired over seeds (scores, or gaps with ``gap``), gated."""
    grid, constants = results.get("grid") or {}, results.get("constants")
    name = f"{_LABELS.get(a, a)} - {_LABELS.get(b, b)}" + (" (gap)" if gap else "")
    missing = _missing(grid, task, (a, b))
    if missing:
        return {"task": task, "part": name, "outcome": NOT_JUDGED, "text": missing}
    entries = {a: _entry(grid, task, a), b: _entry(grid, task, b)}
    scores = {row: by_seed(entry["runs"]) for row, entry in entries.items()}
    values = {row: _gaps(entry) for row, entry in entries.items()} if gap else scores
    pair = paired(values[a], values[b])
    if pair is None:
        return {"task": task, "part": name, "outcome": NOT_JUDGED,
                "text": f"{task}: {name}: fewer than 2 seeds where both finished"}
    gate = comparison_gate(constants, task, {_LABELS.get(r, r): scores[r] for r in (a, b)}, pair.seeds, need)
    if gate is None and gap:
        train = {_LABELS.get(r, r): by_seed(entries[r]["runs"], "train_score") for r in (a, b)}
        gate = fit_gate(constants, task, train, pair.seeds)
    if gate is not None:
        return {"task": task, "part": name, "outcome": NOT_JUDGED, "text": gate, "paired": pair.to_dict()}
    outcome = test(pair)
    return {"task": task, "part": name, "outcome": outcome, "text": f"{task}: {name} = {pair.text()}: {outcome}",
            "paired": pair.to_dict()}


def _task_outcome(parts: Sequence[Dict[str, Any]]) -> str:
    outcomes = [p["outcome"] for p in parts]
    for outcome in (FAILS, NOT_JUDGED, UNDECIDED):
        if outcome in outcomes:
            return outcome
    return HOLDS


def _combine(number: int, per_task: Dict[str, List[Dict[str, Any]]], nothing: str) -> Dict[str, Any]:
    """Claim ``number`` from its parts per task, by ``COMBINE_RULE``."""
    if not per_task:
        return _verdict(number, NOT_TESTABLE, nothing)
    outcomes = {task: _task_outcome(parts) for task, parts in per_task.items()}
    count = {o: sum(v == o for v in outcomes.values()) for o in (HOLDS, FAILS, UNDECIDED, NOT_JUDGED)}
    if count[FAILS]:
        verdict = NOT_REPRODUCED
    elif count[HOLDS]:
        verdict = REPRODUCED
    else:
        verdict = NOT_TESTABLE
    summary = (f"holds in {count[HOLDS]}, fails in {count[FAILS]}, undecided (seed noise) in {count[UNDECIDED]}, "
               f"not testable in {count[NOT_JUDGED]} of {len(outcomes)} task(s)")
    evidence = summary + ": " + "; ".join(p["text"] for parts in per_task.values() for p in parts)
    return _verdict(number, verdict, evidence, {"per_task": outcomes, "parts": per_task, "counts": count})


def _tasks_with_any(grid: Mapping[str, Any], rows: Sequence[str]) -> List[str]:
    return [t for t in grid if any(_entry(grid, t, r) is not None for r in rows)]


# ---- the claims -------------------------------------------------------------------------------------


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


def _match(number: int, results: Mapping[str, Any], tasks: Sequence[str]) -> Dict[str, Any]:
    grid = results.get("grid") or {}
    per_task = {t: [_compare(results, t, "bitfit", "full", lambda p: within(p, MATCH_WITHIN), BOTH)]
                for t in tasks if t in _tasks_with_any(grid, ("bitfit", "full"))}
    return _combine(number, per_task, "no task has BitFit and full fine-tuning in this budget")


def claim_2(results: Mapping[str, Any]) -> Dict[str, Any]:
    return _match(2, results, list(results.get("grid") or {}))


def claim_8(results: Mapping[str, Any]) -> Dict[str, Any]:
    return _match(8, results, ["pos"])


def _negated(p: Paired) -> Paired:
    return Paired(p.seeds, tuple(-d for d in p.differences))


def claim_3(results: Mapping[str, Any]) -> Dict[str, Any]:
    curve = results.get("curve") or {}
    task, constants = curve.get("task"), results.get("constants")
    by_size = {m: {p["size"]: p for p in points} for m, points in (curve.get("methods") or {}).items()}
    if "bitfit" not in by_size or "full" not in by_size:
        return _verdict(3, NOT_TESTABLE, "no training-size curve with both BitFit and full fine-tuning")
    usable, skipped = [], []
    for size in sorted(set(by_size["bitfit"]) & set(by_size["full"])):
        ours, theirs = (by_seed(by_size[m][size].get("runs", [])) for m in ("bitfit", "full"))
        pair = paired(ours, theirs)
        if pair is None:
            skipped.append(f"n={size}: fewer than 2 seeds where both finished")
            continue
        gate = comparison_gate(constants, task, {"BitFit": ours, "full": theirs}, pair.seeds, EITHER)
        if gate is not None:
            skipped.append(f"n={size}: {gate}")
            continue
        usable.append({"size": size, "pair": pair, "difference": pair.mean})
    crossover = find_crossover([{"size": u["size"], "difference": u["difference"]} for u in usable])
    numbers = {"task": task, "points": [{"size": u["size"], **u["pair"].to_dict()} for u in usable],
               "skipped": skipped, "crossover_size": crossover}
    skipped_text = ("; skipped: " + "; ".join(skipped)) if skipped else ""
    if len(usable) < 2:
        return _verdict(3, NOT_TESTABLE, f"{task}: fewer than two training sizes pass the validity gate" + skipped_text,
                        numbers)
    small, large = usable[0], usable[-1]
    ahead_small = exceeds(small["pair"], 0.0)
    behind_large = exceeds(_negated(large["pair"]), 0.0)
    if FAILS in (ahead_small, behind_large):
        verdict = NOT_REPRODUCED
    elif ahead_small == behind_large == HOLDS:
        verdict = REPRODUCED
    else:
        verdict = NOT_TESTABLE
    evidence = (f"{task}: BitFit - full = " + ", ".join(f"{u['pair'].text()} at n={u['size']}" for u in usable)
                + f"; BitFit ahead at n={small['size']}: {ahead_small}; full ahead at n={large['size']}: {behind_large}; "
                + (f"crossover at n≈{crossover:.0f}" if crossover else "no change of sign from + to - within the sizes")
                + skipped_text)
    return _verdict(3, verdict, evidence, numbers)


def claim_4(results: Mapping[str, Any]) -> Dict[str, Any]:
    rows = ("bitfit", "paper_subset", "b_q", "b_m2", "frozen")
    grid = results.get("grid") or {}
    per_task = {
        t: [
            _compare(results, t, "bitfit", "paper_subset", lambda p: at_most(p, SUBSET_NEARLY_WITHIN), EITHER),
            _compare(results, t, "paper_subset", "b_q", lambda p: exceeds(p, SINGLE_ROLE_WORSE_BY), EITHER),
            _compare(results, t, "paper_subset", "b_m2", lambda p: exceeds(p, SINGLE_ROLE_WORSE_BY), EITHER),
            _compare(results, t, "bitfit", "frozen", lambda p: exceeds(p, FROZEN_WORSE_BY), EITHER),
        ]
        for t in _tasks_with_any(grid, rows[1:])
    }
    return _combine(4, per_task, "no task has the bias subsets (b_q + b_m2, b_q, b_m2) or frozen in this budget")


def claim_5(results: Mapping[str, Any]) -> Dict[str, Any]:
    grid = results.get("grid") or {}
    per_task = {
        t: [_compare(results, t, "bitfit", row, lambda p: exceeds(p, RANDOM_WORSE_BY), EITHER)
            for row in ("rand_uniform", "rand_row_col")]
        for t in _tasks_with_any(grid, ("rand_uniform", "rand_row_col"))
    }
    return _combine(5, per_task, "no task has the random baselines in this budget")


def _ranking(matrix: Mapping[str, Any]) -> List[Tuple[str, float]]:
    averages = dict(zip(matrix["roles"], matrix["average"]))
    ranked = [(role, averages[role]) for role in FIGURE1_ROLES if averages.get(role) is not None]
    return sorted(ranked, key=lambda item: -item[1])


def figure1_ranking(bias_change: Optional[Mapping[str, Any]]) -> List[Tuple[str, float]]:
    """(role, mean change per layer) for the paper's in-layer roles, largest first, task-averaged (the figure)."""
    return _ranking(bias_change["matrix"]) if bias_change else []


def claim_6(results: Mapping[str, Any]) -> Dict[str, Any]:
    change = results.get("bias_change") or {}
    grid, constants = results.get("grid") or {}, results.get("constants")
    per_task = change.get("per_task") or {}
    if not per_task:
        return _verdict(6, NOT_TESTABLE, "no bias-change matrix from a BitFit (all biases) run")
    judged: Dict[str, Dict[str, Any]] = {}
    skipped = []
    for task, matrix in sorted(per_task.items()):
        entry = _entry(grid, task, "bitfit")
        seeds = (change.get("per_task_seeds") or {}).get(task) or sorted(by_seed((entry or {}).get("runs", [])))
        gate = comparison_gate(constants, task, {"BitFit": by_seed((entry or {}).get("runs", []))}, seeds, BOTH)
        ranking = _ranking(matrix)
        if gate is not None:
            skipped.append(gate)
            continue
        if len(ranking) < 3 or "b_k" not in dict(ranking):
            skipped.append(f"{task}: the matrix lacks b_q, b_k or b_m2")
            continue
        holds = {r for r, _ in ranking[:2]} == {"b_q", "b_m2"} and ranking[-1][0] == "b_k"
        judged[task] = {"holds": holds, "ranking": ranking, "seeds": list(seeds)}
    numbers = {"per_task": judged, "skipped": skipped, "holds_in": sum(j["holds"] for j in judged.values()),
               "judged": len(judged)}
    skipped_text = ("; skipped: " + "; ".join(skipped)) if skipped else ""
    if not judged:
        return _verdict(6, NOT_TESTABLE, "no task's BitFit runs pass the validity gate" + skipped_text, numbers)
    ok = numbers["holds_in"] * 2 > len(judged)
    evidence = (f"holds in {numbers['holds_in']} of {len(judged)} judged task(s): " + "; ".join(
        f"{task} ({'holds' if j['holds'] else 'fails'}): " + " > ".join(f"{r} {v:.2e}" for r, v in j["ranking"])
        for task, j in judged.items()) + skipped_text)
    return _verdict(6, REPRODUCED if ok else NOT_REPRODUCED, evidence, numbers)


def claim_7(results: Mapping[str, Any]) -> Dict[str, Any]:
    grid = results.get("grid") or {}
    per_task = {t: [_compare(results, t, "full", "bitfit", lambda p: exceeds(p, GAP_SMALLER_BY), BOTH, gap=True)]
                for t in _tasks_with_any(grid, ("bitfit", "full"))}
    return _combine(7, per_task, "no task has BitFit and full fine-tuning in this budget")


def judge_all(results: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The eight verdicts from the aggregated ``results`` (``grid``, ``curve``, ``bias_change``, ``constants``
    and ``param_counts`` for claim 1)."""
    return [
        claim_1(results.get("param_counts")),
        claim_2(results),
        claim_3(results),
        claim_4(results),
        claim_5(results),
        claim_6(results),
        claim_7(results),
        claim_8(results),
    ]
