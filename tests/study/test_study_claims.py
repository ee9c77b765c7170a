"""The verdict logic on hand-made results: each claim's rule, its numbers, and 'not testable here'."""

from __future__ import annotations

import math

import pytest

from bitfit_hf.study import claims
from bitfit_hf.study.aggregate import find_crossover, stat
from bitfit_hf.study.claims import NOT_REPRODUCED, NOT_TESTABLE, REPRODUCED, judge_all
from bitfit_hf.study.outcome import epochs_to_converge
from bitfit_hf.study.runner import NOT_AVAILABLE


def entry(score, gap=None, status="done"):
    """A grid entry as aggregate.grid_table writes it (None score: nothing finished)."""
    if score is None:
        return {"status": status, "score": stat([]), "train_score": stat([]), "gap": stat([])}
    train = None if gap is None else score + gap
    return {"status": status, "score": stat([score]), "train_score": stat([train]), "gap": stat([gap])}


def verdicts(**results):
    return {v["id"]: v for v in judge_all(results)}


def counts(base_percent, large_percent):
    return {
        "bert-base": {"total_params": 1e8, "all_bias_params": base_percent * 1e6, "all_percent": base_percent},
        "bert-large": {"total_params": 3e8, "all_bias_params": large_percent * 3e6, "all_percent": large_percent},
    }


def test_stat_mean_std_and_missing_values():
    assert stat([1.0, 2.0, 3.0]) == {"mean": 2.0, "std": 1.0, "n": 3, "values": [1.0, 2.0, 3.0]}
    assert stat([5.0, None])["std"] == 0.0 and stat([5.0, None])["n"] == 1
    assert stat([])["mean"] is None and stat([float("nan")])["n"] == 0


def test_claim_1_rounds_to_the_published_percentages():
    assert verdicts(param_counts=counts(0.094, 0.0813))[1]["verdict"] == REPRODUCED
    assert verdicts(param_counts=counts(0.12, 0.0813))[1]["verdict"] == NOT_REPRODUCED
    assert verdicts(param_counts=None)[1]["verdict"] == NOT_TESTABLE


def test_claim_2_bitfit_within_one_point_on_average():
    grid = {"a": {"bitfit": entry(80.0), "full": entry(80.5)}, "b": {"bitfit": entry(70.0), "full": entry(71.2)}}
    v = verdicts(grid=grid)[2]
    assert v["verdict"] == REPRODUCED and v["numbers"]["mean_difference"] == pytest.approx(-0.85)
    grid["b"]["full"] = entry(73.0)  # mean difference -1.75
    assert verdicts(grid=grid)[2]["verdict"] == NOT_REPRODUCED
    missing = {"a": {"bitfit": entry(80.0), "full": entry(None, status=NOT_AVAILABLE)}}
    v = verdicts(grid=missing)[2]
    assert v["verdict"] == NOT_TESTABLE and NOT_AVAILABLE in v["evidence"]


def test_claim_3_needs_bitfit_ahead_small_and_behind_large():
    def curve(diffs):
        points = [{"size": s, "difference": d} for s, d in diffs]
        return {"task": "sentiment", "differences": points, "crossover_size": find_crossover(points)}

    v = verdicts(curve=curve([(100, 3.0), (400, 1.0), (1600, -2.0)]))[3]
    assert v["verdict"] == REPRODUCED
    # linear in log size between 400 (+1) and 1600 (-2): a third of the way
    assert v["numbers"]["crossover_size"] == pytest.approx(math.exp(math.log(400) + math.log(4) / 3))
    assert verdicts(curve=curve([(100, 3.0), (1600, 0.5)]))[3]["verdict"] == NOT_REPRODUCED  # no crossover
    assert verdicts(curve=curve([(100, -1.0), (1600, -3.0)]))[3]["verdict"] == NOT_REPRODUCED  # full always ahead
    assert verdicts(curve=curve([(100, 1.0)]))[3]["verdict"] == NOT_TESTABLE
    assert find_crossover([{"size": 10, "difference": -1.0}, {"size": 20, "difference": 1.0}]) is None


def test_claim_4_subset_nearly_single_roles_and_frozen_worse():
    rows = {"bitfit": entry(80.0), "paper_subset": entry(79.0), "b_q": entry(77.5), "b_m2": entry(78.0),
            "frozen": entry(70.0)}
    assert verdicts(grid={"t": rows})[4]["verdict"] == REPRODUCED
    for name, value in (("paper_subset", 78.0), ("b_m2", 78.5), ("frozen", 76.0)):
        changed = {**rows, name: entry(value)}
        v = verdicts(grid={"t": changed})[4]
        assert v["verdict"] == NOT_REPRODUCED and "(fails)" in v["evidence"], name
    assert verdicts(grid={"t": {k: v for k, v in rows.items() if k != "b_q"}})[4]["verdict"] == NOT_TESTABLE


def test_claim_5_random_subsets_and_unavailable_methods():
    rows = {"bitfit": entry(80.0), "rand_uniform": entry(77.0), "rand_row_col": entry(76.0)}
    assert verdicts(grid={"t": rows})[5]["verdict"] == REPRODUCED
    rows["rand_row_col"] = entry(79.0)
    assert verdicts(grid={"t": rows})[5]["verdict"] == NOT_REPRODUCED
    unavailable = {"t": {"bitfit": entry(80.0), "rand_uniform": entry(None, status=NOT_AVAILABLE),
                         "rand_row_col": entry(None, status=NOT_AVAILABLE)}}
    v = verdicts(grid=unavailable)[5]
    assert v["verdict"] == NOT_TESTABLE and NOT_AVAILABLE in v["evidence"]


def _bias_change(averages):
    return {"tasks": ["t"], "runs": 1, "matrix": {"roles": list(averages), "average": list(averages.values())}}


def test_claim_6_ranking_of_the_paper_roles():
    paper = {"b_m2": 0.09, "b_q": 0.08, "b_LN1": 0.05, "b_v": 0.04, "b_m1": 0.03, "b_m3": 0.02, "b_LN2": 0.01,
             "b_k": 0.0001, "b_pooler": 0.5}  # roles outside the layers do not enter the ranking
    v = verdicts(bias_change=_bias_change(paper))[6]
    assert v["verdict"] == REPRODUCED and [r for r, _ in v["numbers"]["ranking"]][:2] == ["b_m2", "b_q"]
    assert verdicts(bias_change=_bias_change({**paper, "b_v": 0.085}))[6]["verdict"] == NOT_REPRODUCED
    assert verdicts(bias_change=_bias_change({**paper, "b_k": 0.011}))[6]["verdict"] == NOT_REPRODUCED
    assert verdicts(bias_change=None)[6]["verdict"] == NOT_TESTABLE


def test_claim_7_generalisation_gap():
    grid = {"a": {"bitfit": entry(80.0, gap=2.0), "full": entry(81.0, gap=5.0)},
            "b": {"bitfit": entry(70.0, gap=1.0), "full": entry(70.0, gap=1.5)}}
    v = verdicts(grid=grid)[7]
    assert v["verdict"] == REPRODUCED and v["numbers"]["mean_difference"] == pytest.approx(1.75)
    grid["a"]["full"] = entry(81.0, gap=2.5)
    assert verdicts(grid=grid)[7]["verdict"] == NOT_REPRODUCED
    assert verdicts(grid={"a": {"bitfit": entry(80.0), "full": entry(80.0)}})[7]["verdict"] == NOT_TESTABLE


def test_claim_8_pos_only():
    assert verdicts(grid={"pos": {"bitfit": entry(91.5), "full": entry(92.0)}})[8]["verdict"] == REPRODUCED
    assert verdicts(grid={"pos": {"bitfit": entry(90.0), "full": entry(92.0)}})[8]["verdict"] == NOT_REPRODUCED
    assert verdicts(grid={"sentiment": {"bitfit": entry(90.0), "full": entry(92.0)}})[8]["verdict"] == NOT_TESTABLE


def test_every_claim_is_judged_once_with_its_rule():
    results = judge_all({})
    assert [v["id"] for v in results] == list(range(1, 9))
    assert all(v["rule"] == claims.RULES[v["id"]] and v["verdict"] == NOT_TESTABLE for v in results)


def test_epochs_to_converge_is_the_first_epoch_within_a_point_of_the_best():
    assert epochs_to_converge([(1.0, 70.0), (2.0, 79.5), (3.0, 80.0), (4.0, 79.8)]) == 2.0
    assert epochs_to_converge([(1.0, 80.0), (2.0, 60.0)]) == 1.0
    assert epochs_to_converge([]) is None
