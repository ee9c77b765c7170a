"""The study's head: `frozen` is the converged probe (never swept), every other row trains its head from random
numbers as in the paper, and cells recorded before the switch existed keep their identity."""

from __future__ import annotations

import os

from bitfit_hf.study.budgets import BUDGETS, METHOD_ROWS
from bitfit_hf.study.grid import StudySettings, plan, sweep_plan, swept_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU_CELLS = os.path.join(ROOT, "docs", "reproduction", "gpu", "study", "cells")


def _switch(argv):
    at = argv.index("--probe_head_start")
    return argv[at + 1]


def test_every_row_says_how_its_head_starts_and_only_frozen_starts_from_the_probe():
    budget = BUDGETS["default"]
    cells = plan(budget, rates={(t, m): 1e-3 for t in budget.tasks for m in METHOD_ROWS})
    settings = StudySettings(device="cpu")
    seen = set()
    for cell in cells:
        argv = cell.recipe_args(settings)
        assert argv.count("--probe_head_start") == 1
        assert _switch(argv) == ("true" if cell.method == "frozen" else "false")
        seen.add(cell.method)
    assert {"frozen", "bitfit", "full"} <= seen


def test_the_probe_row_is_never_swept():
    for budget in BUDGETS.values():
        for task, share in budget.tasks.items():
            rows = swept_rows(budget, task)
            assert "frozen" not in rows
            if budget.sweep is not None and "bitfit" in share.methods:
                assert "bitfit" in rows
        assert not [c for c in sweep_plan(budget) if c.method == "frozen"]


def test_cells_recorded_before_the_switch_keep_their_identity():
    """The committed GPU run's records (made when every head started from random numbers) are found under the ids
    the grid plans today for every row but the probe."""
    recorded = {name[:-len(".json")] for name in os.listdir(GPU_CELLS) if name.endswith(".json")}
    settings = StudySettings(device="cuda", model_name_or_path="/tmp/mpnet-fp16", recipe_args=("--tf32", "True"))
    budget = BUDGETS["gpu"]
    # (the pair task is left out: its data changed since, and with it every pair cell's identity)
    sweep_ids = {c.cell_id(settings) for c in sweep_plan(budget) if c.task != "pair"}
    assert sweep_ids and sweep_ids <= recorded  # no frozen sweep cell is planned any more; every other one matches
    frozen = [c for c in plan(budget, rates={}) if c.method == "frozen"]
    assert frozen and not {c.cell_id(settings) for c in frozen} & recorded  # the SGD head's records are not the probe's
