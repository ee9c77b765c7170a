"""The verdict logic on hand-made results: each claim's rule, its gate, its noise test and 'not testable here'."""

from __future__ import annotations

import math

import pytest

from bitfit_hf.study import claims
from bitfit_hf.study.aggregate import find_crossover, stat
from bitfit_hf.study.claims import NOT_REPRODUCED, NOT_TESTABLE, REPRODUCED, judge_all
from bitfit_hf.study.outcome import epochs_to_converge, loss_curve
from bitfit_hf.study.state import NOT_AVAILABLE

#: Every hand-made task has the same constant predictor: 50 on validation and training examples, so a run is
#: valid above 55 and fits its training set at 90 or more.
CONSTANTS = {t: {"rule": "most frequent class", "validation": {"score": 50.0, "n": 400},
                 "train": {"score": 50.0, "n": 400}} for t in ("sentiment", "pair", "pos", "qa", "t", "u", "v")}


def entry(scores, train=None, status="done"):
    """A grid entry as aggregate.grid_table writes it: ``scores`` (and ``train``) are per-seed lists, seeds 1, 2, ...;
    ``None``: nothing finished."""
    if scores is None:
        return {"status": status, "score": stat([]), "train_score": stat([]), "gap": stat([]), "runs": []}
    train = train or [None] * len(scores)
    runs = [{"seed": i, "score": s, "train_score": t} for i, (s, t) in enumerate(zip(scores, train), start=1)]
    return {"status": status, "score": stat(scores), "train_score": stat(train), "runs": runs, "train_size": 400,
            "gap": stat([t - s for s, t in zip(scores, train) if t is not None])}


def verdicts(constants=CONSTANTS, **results):
    return {v["id"]: v for v in judge_all({"constants": constants, **results})}


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


def test_claim_2_is_two_sided_equivalence_on_valid_runs():
    grid = {"t": {"bitfit": entry([80.0, 81.0, 79.5]), "full": entry([80.5, 81.2, 80.0])}}
    v = verdicts(grid=grid)[2]
    assert v["verdict"] == REPRODUCED and "holds in 1" in v["evidence"]
    # the committed POS case: BitFit far ahead of an under-trained full fine-tuning is no match (it passed one-sided)
    grid = {"t": {"bitfit": entry([79.0, 80.0, 79.6]), "full": entry([60.0, 61.0, 59.0])}}
    v = verdicts(grid=grid)[2]
    assert v["verdict"] == NOT_REPRODUCED and "fails" in v["evidence"]
    # BitFit clearly behind: fails the other side
    grid = {"t": {"bitfit": entry([70.0, 71.0, 70.5]), "full": entry([80.0, 80.5, 80.2])}}
    assert verdicts(grid=grid)[2]["verdict"] == NOT_REPRODUCED


def test_claim_2_invalid_runs_are_not_testable_with_run_seed_and_score():
    # the committed pair task: both methods at the constant prediction on every seed
    grid = {"pair": {"bitfit": entry([51.25, 51.25, 51.25]), "full": entry([51.25, 51.25, 51.25])}}
    v = verdicts(grid=grid)[2]
    assert v["verdict"] == NOT_TESTABLE
    assert "constant 50.00 + 5 = 55.00" in v["evidence"] and "all seed 1: 51.25" in v["evidence"]
    # one seed of one run that never took off is enough: a match needs both runs valid on every seed
    grid = {"t": {"bitfit": entry([57.8, 58.8, 46.0]), "full": entry([58.0, 59.0, 58.5])}}
    v = verdicts(grid=grid)[2]
    assert v["verdict"] == NOT_TESTABLE and "seed 3: 46.00" in v["evidence"] and "seed 1" not in v["evidence"]
    # no constant predictor known for the task: nothing can be gated
    v = verdicts(constants={}, grid={"t": {"bitfit": entry([80.0, 81.0]), "full": entry([80.0, 81.0])}})[2]
    assert v["verdict"] == NOT_TESTABLE and "no constant-predictor score" in v["evidence"]


def test_claim_2_seed_noise_leaves_it_undecided_and_one_seed_cannot_judge():
    grid = {"t": {"bitfit": entry([80.0, 90.0, 70.0]), "full": entry([80.0, 80.0, 80.0])}}  # differences 0, +10, -10
    v = verdicts(grid=grid)[2]
    assert v["verdict"] == NOT_TESTABLE and "undecided (seed noise) in 1" in v["evidence"]
    v = verdicts(grid={"t": {"bitfit": entry([80.0]), "full": entry([80.0])}})[2]
    assert v["verdict"] == NOT_TESTABLE and "fewer than 2 seeds" in v["evidence"]
    # a task that fails decides the claim even when another is undecided
    grid["u"] = {"bitfit": entry([70.0, 71.0]), "full": entry([80.0, 81.0])}
    assert verdicts(grid=grid)[2]["verdict"] == NOT_REPRODUCED


def test_claim_2_unavailable_method():
    missing = {"t": {"bitfit": entry([80.0, 81.0]), "full": entry(None, status=NOT_AVAILABLE)}}
    v = verdicts(grid=missing)[2]
    assert v["verdict"] == NOT_TESTABLE and NOT_AVAILABLE in v["evidence"]


def _curve(points, task="qa"):
    """points: {size: (bitfit scores, full scores)}."""
    methods = {"bitfit": [], "full": []}
    for size, (ours, theirs) in sorted(points.items()):
        methods["bitfit"].append({"size": size, **entry(ours)})
        methods["full"].append({"size": size, **entry(theirs)})
    return {"task": task, "methods": methods}


def test_claim_3_bitfit_ahead_small_behind_large_with_the_crossover():
    curve = _curve({100: ([62.0, 63.0], [58.0, 58.5]), 400: ([70.0, 70.5], [69.0, 69.2]),
                    1600: ([75.0, 75.4], [78.0, 78.1])})
    v = verdicts(curve=curve)[3]
    assert v["verdict"] == REPRODUCED
    # mean differences +4.25, +1.15, -2.85: a third-ish of the way from 400 to 1600 in log size
    fraction = 1.15 / (1.15 + 2.85)
    assert v["numbers"]["crossover_size"] == pytest.approx(math.exp(math.log(400) + fraction * math.log(4)))
    curve = _curve({100: ([62.0, 63.0], [64.0, 64.5]), 1600: ([75.0, 75.4], [78.0, 78.1])})
    assert verdicts(curve=curve)[3]["verdict"] == NOT_REPRODUCED  # full ahead at every size
    assert verdicts(curve=None)[3]["verdict"] == NOT_TESTABLE


def test_claim_3_a_tie_at_zero_is_no_crossover():
    # the committed report's "crossover n ~ 100": both at the constant at n=100 (a tie), full ahead after
    curve = _curve({100: ([46.0, 46.0], [46.0, 46.0]), 400: ([60.0, 61.0], [72.0, 72.5]),
                    1600: ([75.0, 75.5], [79.0, 79.5])})
    v = verdicts(curve=curve)[3]
    assert v["verdict"] == NOT_REPRODUCED and v["numbers"]["crossover_size"] is None
    assert "n=100" in v["evidence"] and "skipped" in v["evidence"]  # two runs at the constant: the size is skipped
    # valid runs tied at the smallest size: BitFit is not ahead (fails), and a tie is no change of sign
    curve = _curve({100: ([70.0, 71.0], [70.0, 71.0]), 1600: ([75.0, 75.5], [79.0, 79.5])})
    v = verdicts(curve=curve)[3]
    assert v["verdict"] == NOT_REPRODUCED and v["numbers"]["crossover_size"] is None
    assert find_crossover([{"size": 100, "difference": 0.0}, {"size": 400, "difference": -4.0}]) is None
    assert find_crossover([{"size": 10, "difference": -1.0}, {"size": 20, "difference": 1.0}]) is None
    # +, 0 (tie), -: the sign really changes, between the + and the - sizes
    points = [{"size": 100, "difference": 2.0}, {"size": 400, "difference": 0.0}, {"size": 1600, "difference": -2.0}]
    assert find_crossover(points) == pytest.approx(400.0)


def test_claim_3_too_few_valid_sizes_and_noise():
    curve = _curve({100: ([46.0, 46.0], [46.0, 46.0]), 1600: ([75.0, 75.5], [79.0, 79.5])})
    v = verdicts(curve=curve)[3]
    assert v["verdict"] == NOT_TESTABLE and "fewer than two training sizes pass" in v["evidence"]
    curve = _curve({100: ([70.0, 80.0], [72.0, 72.0]), 1600: ([75.0, 75.5], [79.0, 79.5])})  # +/-: undecided
    assert verdicts(curve=curve)[3]["verdict"] == NOT_TESTABLE


def _claim4_rows(**changed):
    rows = {"bitfit": [80.0, 81.0, 80.5], "paper_subset": [79.5, 80.0, 79.8], "b_q": [76.0, 77.0, 76.5],
            "b_m2": [77.0, 77.5, 77.2], "frozen": [60.0, 61.0, 60.0]}
    rows.update(changed)
    return {"t": {row: entry(scores) for row, scores in rows.items()}}


def test_claim_4_subset_nearly_single_roles_and_frozen_worse():
    assert verdicts(grid=_claim4_rows())[4]["verdict"] == REPRODUCED
    for name, scores in (("paper_subset", [76.0, 77.0, 76.5]), ("b_m2", [79.5, 80.0, 79.9]),
                         ("frozen", [78.0, 79.0, 78.0])):
        v = verdicts(grid=_claim4_rows(**{name: scores}))[4]
        assert v["verdict"] == NOT_REPRODUCED and "fails" in v["evidence"], name
    # frozen at the constant is the effect, not an invalid comparison: all biases are valid
    v = verdicts(grid=_claim4_rows(frozen=[50.0, 50.0, 50.0]))[4]
    assert v["verdict"] == REPRODUCED
    # the committed sentiment rows: every subset, frozen and (one seed of) all biases near the constant
    v = verdicts(grid=_claim4_rows(bitfit=[57.8, 58.8, 46.0], paper_subset=[47.0, 48.0, 47.0], b_q=[46.0, 47.0, 47.0],
                                   b_m2=[47.0, 48.0, 47.0], frozen=[46.0, 47.0, 46.5]))[4]
    assert v["verdict"] == NOT_TESTABLE and "seed 3: 46.00" in v["evidence"]
    rows = _claim4_rows()
    del rows["t"]["b_q"]
    v = verdicts(grid=rows)[4]
    assert v["verdict"] == NOT_TESTABLE and "b_q: not in this budget" in v["evidence"]


def test_claim_5_random_subsets_valid_and_invalid():
    rows = {"bitfit": entry([80.0, 81.0, 80.5]), "rand_uniform": entry([77.0, 77.5, 77.0]),
            "rand_row_col": entry([76.0, 76.5, 76.0])}
    assert verdicts(grid={"t": rows})[5]["verdict"] == REPRODUCED
    rows["rand_row_col"] = entry([79.5, 80.5, 80.0])
    assert verdicts(grid={"t": rows})[5]["verdict"] == NOT_REPRODUCED
    at_constant = {"bitfit": entry([52.0, 53.0, 51.0]), "rand_uniform": entry([47.0, 48.0, 47.0]),
                   "rand_row_col": entry([47.0, 47.5, 47.0])}
    v = verdicts(grid={"t": at_constant})[5]
    assert v["verdict"] == NOT_TESTABLE and "at least one run must exceed" in v["evidence"]
    unavailable = {"t": {"bitfit": entry([80.0, 81.0]), "rand_uniform": entry(None, status=NOT_AVAILABLE),
                         "rand_row_col": entry(None, status=NOT_AVAILABLE)}}
    v = verdicts(grid=unavailable)[5]
    assert v["verdict"] == NOT_TESTABLE and NOT_AVAILABLE in v["evidence"]


PAPER = {"b_m2": 0.09, "b_q": 0.08, "b_LN1": 0.05, "b_v": 0.04, "b_m1": 0.03, "b_m3": 0.02, "b_LN2": 0.01,
         "b_k": 0.0001, "b_pooler": 0.5}  # roles outside the layers do not enter the ranking


def _bias_change(per_task):
    matrices = {t: {"roles": list(a), "average": list(a.values())} for t, a in per_task.items()}
    mean = {r: sum(a[r] for a in per_task.values()) / len(per_task) for r in PAPER}
    return {"tasks": list(per_task), "runs": 3 * len(per_task), "matrix": {"roles": list(mean), "average": list(mean.values())},
            "per_task": matrices, "per_task_seeds": {t: [1, 2, 3] for t in per_task}}


def test_claim_6_per_task_ranks_with_the_count_and_invalid_tasks_skipped():
    valid = {"bitfit": entry([80.0, 81.0, 80.5])}
    grid = {"t": valid, "u": valid, "v": valid}
    flat = {**PAPER, "b_LN1": 0.085}  # b_LN1 second: fails in that task
    v = verdicts(grid=grid, bias_change=_bias_change({"t": PAPER, "u": PAPER, "v": flat}))[6]
    assert v["verdict"] == REPRODUCED and "holds in 2 of 3 judged task(s)" in v["evidence"]
    assert v["numbers"]["holds_in"] == 2 and v["numbers"]["judged"] == 3
    v = verdicts(grid=grid, bias_change=_bias_change({"t": PAPER, "v": flat}))[6]
    assert v["verdict"] == NOT_REPRODUCED and "holds in 1 of 2" in v["evidence"]  # not more than half
    assert verdicts(grid=grid, bias_change=_bias_change({"t": {**PAPER, "b_k": 0.011}}))[6]["verdict"] == NOT_REPRODUCED
    # a task whose BitFit runs sit at the constant is skipped, with the reason; the paper's ranking elsewhere holds
    grid["u"] = {"bitfit": entry([51.25, 51.25, 51.25])}
    v = verdicts(grid=grid, bias_change=_bias_change({"t": PAPER, "u": flat}))[6]
    assert v["verdict"] == REPRODUCED and "holds in 1 of 1" in v["evidence"] and "u: the run must exceed" in v["evidence"]
    v = verdicts(grid={"u": grid["u"]}, bias_change=_bias_change({"u": PAPER}))[6]
    assert v["verdict"] == NOT_TESTABLE
    assert verdicts(bias_change=None)[6]["verdict"] == NOT_TESTABLE


def test_claim_7_only_over_runs_that_fit_their_training_set():
    grid = {"t": {"bitfit": entry([80.0, 81.0, 80.5], train=[92.0, 93.0, 92.5]),
                  "full": entry([82.0, 82.5, 82.0], train=[99.0, 99.5, 99.0])}}
    v = verdicts(grid=grid)[7]  # gaps 12 vs 17: full's is larger by 5
    assert v["verdict"] == REPRODUCED and v["numbers"]["parts"]["t"][0]["paired"]["mean"] == pytest.approx(5.0)
    grid["t"]["bitfit"] = entry([80.0, 81.0, 80.5], train=[97.0, 98.0, 97.5])
    assert verdicts(grid=grid)[7]["verdict"] == NOT_REPRODUCED
    # full fine-tuning that under-fits (the committed QA and POS runs): its small gap means nothing
    grid["t"]["full"] = entry([70.0, 70.5, 70.2], train=[72.0, 72.5, 72.0])
    v = verdicts(grid=grid)[7]
    assert v["verdict"] == NOT_TESTABLE and "below the fit threshold 90.00" in v["evidence"]
    assert "full seed 1: 72.00" in v["evidence"]
    no_train = {"t": {"bitfit": entry([80.0, 81.0]), "full": entry([80.0, 81.0])}}
    assert verdicts(grid=no_train)[7]["verdict"] == NOT_TESTABLE


def test_claim_8_pos_only():
    assert verdicts(grid={"pos": {"bitfit": entry([91.5, 92.0]), "full": entry([92.0, 92.3])}})[8]["verdict"] == REPRODUCED
    v = verdicts(grid={"pos": {"bitfit": entry([79.0, 80.0, 79.6]), "full": entry([44.0, 44.2, 43.8])}})[8]
    assert v["verdict"] == NOT_TESTABLE  # full fine-tuning at 44 does not beat POS's constant: no match to judge
    v = verdicts(grid={"pos": {"bitfit": entry([79.0, 80.0, 79.6]), "full": entry([64.0, 64.2, 63.8])}})[8]
    assert v["verdict"] == NOT_REPRODUCED  # both valid, 15 points apart: no match
    v = verdicts(grid={"sentiment": {"bitfit": entry([90.0, 91.0]), "full": entry([92.0, 92.0])}})[8]
    assert v["verdict"] == NOT_TESTABLE


def test_every_claim_is_judged_once_with_its_rule():
    results = judge_all({})
    assert [v["id"] for v in results] == list(range(1, 9))
    assert all(v["rule"] == claims.RULES[v["id"]] and v["verdict"] == NOT_TESTABLE for v in results)


def test_epochs_to_converge_and_the_training_loss_curve():
    assert epochs_to_converge([(1.0, 70.0), (2.0, 79.5), (3.0, 80.0), (4.0, 79.8)]) == 2.0
    assert epochs_to_converge([(1.0, 80.0), (2.0, 60.0)]) == 1.0
    assert epochs_to_converge([]) is None
    state = {"log_history": [{"epoch": 0.5, "loss": 0.7, "step": 5}, {"epoch": 1.0, "eval_accuracy": 0.8},
                             {"epoch": 1.0, "loss": 0.4, "step": 10}, {"train_loss": 0.55, "epoch": 1.0}]}
    assert loss_curve(state) == [(0.5, 0.7), (1.0, 0.4)] and loss_curve(None) == []


def _matrix(per_role):
    from bitfit_hf.reporting.heatmap import BiasChange

    return BiasChange.from_cells({(role, str(layer)): value for role, value in per_role.items() for layer in (0, 1)}).to_dict()


def test_the_averaged_figure_1_leaves_out_tasks_whose_runs_are_not_valid():
    from bitfit_hf.study.aggregate import bias_change_over

    flat = {role: 0.05 for role in PAPER if role != "b_pooler"}  # a task that learned nothing: every bias alike
    change = {"tasks": ["pair", "sentiment"], "runs": 6, "matrix": {}, "per_task": {"pair": _matrix(flat),
              "sentiment": _matrix({r: v for r, v in PAPER.items() if r != "b_pooler"})},
              "per_task_seeds": {"pair": [1, 2, 3], "sentiment": [1, 2, 3]}}
    kept = bias_change_over(change, ["sentiment"])
    assert kept["tasks"] == ["sentiment"] and kept["left_out"] == ["pair"] and kept["runs"] == 3
    assert [role for role, _ in claims.figure1_ranking(kept)][:2] == ["b_m2", "b_q"]
    assert dict(zip(kept["matrix"]["roles"], kept["matrix"]["average"]))["b_k"] == pytest.approx(0.0001)
    assert kept["per_task"] == change["per_task"]  # the per-task matrices (claim 6's table) stay whole
    assert bias_change_over(change, ["pair", "sentiment"])["left_out"] == []
    assert bias_change_over(change, [])["tasks"] == ["pair", "sentiment"]  # no valid task: the figure as it is
    assert bias_change_over(None, ["sentiment"]) is None
