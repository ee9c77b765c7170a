"""The pieces under the verdicts: the seed-noise comparison, the validity and fit gates, the constant
predictors (hand-made and on the real offline data), and the sweep's choice of a learning rate."""

from __future__ import annotations

import math

import pytest

from bitfit_hf.study.baselines import best_class_accuracy, best_prefix_f1, best_tag_accuracy, task_constants
from bitfit_hf.study.budgets import Budget, SweepBudget, TaskBudget
from bitfit_hf.study.compare import FAILS, HOLDS, K_SE, UNDECIDED, Paired, at_most, exceeds, paired, within
from bitfit_hf.study.gates import (
    BOTH,
    EITHER,
    VALID_MARGIN,
    comparison_gate,
    fit_gate,
    fit_threshold,
    validity_table,
)
from bitfit_hf.study.grid import Cell
from bitfit_hf.study.state import CellState
from bitfit_hf.study.sweep import CHOSEN, choose_rates, chosen_rates


def test_paired_differences_mean_and_interval():
    p = paired({1: 80.0, 2: 82.0, 3: 81.0, 4: 70.0}, {1: 78.0, 2: 79.0, 3: 80.0})  # seed 4: one side only
    assert p.seeds == (1, 2, 3) and p.differences == (2.0, 3.0, 1.0)
    assert p.mean == pytest.approx(2.0) and p.se == pytest.approx(1.0 / math.sqrt(3))
    assert p.low == pytest.approx(2.0 - K_SE / math.sqrt(3)) and p.high == pytest.approx(2.0 + K_SE / math.sqrt(3))
    assert paired({1: 80.0}, {1: 70.0, 2: 71.0}) is None  # one shared seed: no noise estimate
    assert "+2.00 ± " in p.text()


def test_exceeds_at_most_within_and_the_tie():
    clear = Paired((1, 2, 3), (6.0, 6.5, 7.0))
    assert exceeds(clear, 5.0) == HOLDS and exceeds(clear, 8.0) == FAILS
    noisy = Paired((1, 2, 3), (6.0, -4.0, 14.0))
    assert exceeds(noisy, 2.0) == UNDECIDED
    tie = Paired((1, 2), (0.0, 0.0))  # identical scores on every seed: no advantage, not "undecided"
    assert exceeds(tie, 0.0) == FAILS and within(tie, 2.0) == HOLDS
    below = Paired((1, 2, 3), (0.5, 0.7, 0.6))
    assert exceeds(below, 1.0) == FAILS and at_most(below, 1.5) == HOLDS and at_most(clear, 1.5) == FAILS
    assert within(Paired((1, 2, 3), (-1.0, 0.5, 0.2)), 2.0) == HOLDS
    assert within(Paired((1, 2, 3), (35.0, 36.0, 35.5)), 2.0) == FAILS  # far ahead is no match either
    assert within(Paired((1, 2, 3), (-35.0, -36.0, -35.5)), 2.0) == FAILS
    assert within(Paired((1, 2, 3), (1.0, 3.0, 2.0)), 2.0) == UNDECIDED


def test_comparison_gate_names_run_seed_and_score():
    constants = {"t": {"validation": {"score": 50.0}}}
    good, stuck = {1: 80.0, 2: 81.0}, {1: 50.0, 2: 56.0}
    assert comparison_gate(constants, "t", {"all": good, "full": good}, (1, 2), BOTH) is None
    reason = comparison_gate(constants, "t", {"all": good, "full": stuck}, (1, 2), BOTH)
    assert reason == ("t: both runs must exceed the constant 50.00 + 5 = 55.00 on every seed; full seed 1: 50.00")
    assert comparison_gate(constants, "t", {"all": good, "frozen": stuck}, (1, 2), EITHER) is None
    reason = comparison_gate(constants, "t", {"all": stuck, "frozen": stuck}, (1, 2), EITHER)
    assert "at least one run" in reason and "all seed 1: 50.00" in reason and "frozen seed 1: 50.00" in reason
    assert "seed 3: no score" in comparison_gate(constants, "t", {"all": good}, (1, 2, 3), BOTH)
    assert "no constant-predictor score" in comparison_gate({}, "t", {"all": good}, (1,), BOTH)
    assert VALID_MARGIN == 5.0  # stated in the report; changing it changes every verdict


def test_fit_gate_and_the_validity_table():
    constants = {"t": {"validation": {"score": 50.0}, "train": {"score": 60.0}}}
    assert fit_threshold(60.0) == pytest.approx(92.0)
    assert fit_gate(constants, "t", {"all": {1: 95.0, 2: 92.0}}, (1, 2)) is None
    reason = fit_gate(constants, "t", {"all": {1: 95.0, 2: 91.0}, "full": {1: 99.0, 2: 99.0}}, (1, 2))
    assert reason.endswith("all seed 2: 91.00") and "fit threshold 92.00" in reason
    grid = {"t": {"bitfit": {"train_size": 400, "runs": [{"seed": 1, "score": 56.0, "train_score": 95.0},
                                                         {"seed": 2, "score": 55.0, "train_score": 80.0}]}}}
    curve = {"task": "t", "methods": {"bitfit": [{"size": 400, "runs": []},
                                                 {"size": 100, "runs": [{"seed": 1, "score": 40.0}]}]}}
    table = validity_table(grid, curve, constants)
    assert [(r["row"], r["size"]) for r in table] == [("bitfit", 400), ("bitfit", 100)]
    assert [(r["valid"], r.get("fits")) for r in table[0]["runs"]] == [(True, True), (False, False)]


def test_constant_predictors_on_hand_made_examples():
    assert best_class_accuracy([0, 1, 1, 1]) == 75.0
    assert best_class_accuracy(["b", "a"]) == 50.0
    with pytest.raises(ValueError):
        best_class_accuracy([])
    assert best_tag_accuracy([["NN", "VB"], ["NN", "NN", "DT"]]) == 60.0
    questions = [("Denver Broncos won the game", ["Denver Broncos"]), ("Paris is the capital", ["Paris"])]
    f1, k = best_prefix_f1(questions)
    # k=1: F1 2/3 and 1 -> 83.3; k=2: 1 and 2/3 ("Paris is" vs "Paris") -> 83.3; ties go to the shorter answer
    assert k == 1 and f1 == pytest.approx(100 * (2 / 3 + 1) / 2)


def test_constant_predictors_on_the_real_offline_slices():
    """The WSJ sample (801 training lines, 100 validation): the slices the recipes score, read from the asset."""
    from bitfit_hf.data.offline import load_offline_dataset

    raw = load_offline_dataset("wsj_pos")
    constants = task_constants("pos", "wsj_pos", eval_samples=50, train_samples=200, dev_samples=100)
    validation = [tag for row in raw["validation"].select(range(50)) for tag in row["pos_tags"]]
    assert constants["validation"]["score"] == pytest.approx(best_class_accuracy(validation))
    assert constants["validation"]["n"] == 50 and constants["train"]["n"] == 200 and constants["dev"]["n"] == 100
    dev = [tag for row in raw["train"].select(range(701, 801)) for tag in row["pos_tags"]]  # the last 100 lines
    assert constants["dev"]["score"] == pytest.approx(best_class_accuracy(dev))
    assert 5.0 < constants["validation"]["score"] < 30.0  # the most frequent PTB tag covers a minority of words
    assert "most frequent tag" in constants["rule"]


def _sweep_state(rate, seed, status, score=None):
    cell = Cell("t", "bitfit", 16, seed, 1.0, 8, 0, False, learning_rate=rate, stage="sweep", dev_samples=8)
    record = None if score is None else {"seed": seed, "score": score, "final_train_loss": 0.3}
    return CellState(cell, f"sweep-{rate}-{seed}", status, record)


def test_the_sweep_chooses_the_best_mean_dev_score_once_every_rate_finished(monkeypatch):
    from bitfit_hf.study import budgets

    monkeypatch.setitem(budgets.TASKS, "t", budgets.TASKS["sentiment"])
    budget = Budget("b", "", {"t": TaskBudget(16, (1, 2), ("bitfit",))}, None,
                    sweep=SweepBudget(rates=(("bitfit", (1e-3, 3e-3, 1e-2)),), seeds=(1, 2)))
    states = [_sweep_state(1e-3, 1, "done", 70.0), _sweep_state(1e-3, 2, "done", 72.0),
              _sweep_state(3e-3, 1, "done", 75.0), _sweep_state(3e-3, 2, "done", 73.0),
              _sweep_state(1e-2, 1, "done", 74.0), _sweep_state(1e-2, 2, "pending")]
    (entry,) = choose_rates(states, budget).values()
    assert entry["status"] == "waiting" and entry["chosen"] is None and chosen_rates({("t", "bitfit"): entry}) == {}
    states[-1] = _sweep_state(1e-2, 2, "done", 76.0)
    entry = choose_rates(states, budget)[("t", "bitfit")]
    assert [r["mean"] for r in entry["rates"]] == [71.0, 74.0, 75.0]
    assert entry["status"] == CHOSEN and entry["chosen"] == 1e-2 and entry["edge"]  # the largest rate tried: flagged
    assert chosen_rates({("t", "bitfit"): entry}) == {("t", "bitfit"): 1e-2}
    assert entry["rates"][2]["runs"] == [{"seed": 1, "score": 74.0, "final_train_loss": 0.3},
                                         {"seed": 2, "score": 76.0, "final_train_loss": 0.3}]


def test_the_sweep_tie_goes_to_the_lower_rate_and_failures_are_named(monkeypatch):
    from bitfit_hf.study import budgets

    monkeypatch.setitem(budgets.TASKS, "t", budgets.TASKS["sentiment"])
    budget = Budget("b", "", {"t": TaskBudget(16, (1,), ("bitfit",))}, None,
                    sweep=SweepBudget(rates=(("bitfit", (1e-3, 3e-3, 1e-2)),)))
    states = [_sweep_state(1e-3, 1, "done", 70.0), _sweep_state(3e-3, 1, "done", 74.0),
              _sweep_state(1e-2, 1, "done", 74.0)]
    entry = choose_rates(states, budget)[("t", "bitfit")]
    assert entry["chosen"] == 3e-3 and not entry["edge"]
    states[2] = _sweep_state(1e-2, 1, "failed")
    entry = choose_rates(states, budget)[("t", "bitfit")]
    assert entry["chosen"] == 3e-3 and entry["edge"] is False and entry["rates"][2]["failed"] == ["sweep-0.01-1"]
    failed = [_sweep_state(r, 1, "failed") for r in (1e-3, 3e-3, 1e-2)]
    assert choose_rates(failed, budget)[("t", "bitfit")]["status"] == "failed"
