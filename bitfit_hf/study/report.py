"""Write the study's report: ``report.md``, ``results.json`` and the PNG figures, from the cell records.

Everything in it is computed from the records on disk, so the report can be rebuilt at any time
(``--report_only``), and a partial study gives a partial report that says what is missing. The results are
assembled by :mod:`bitfit_hf.study.results` and rendered by :mod:`bitfit_hf.study.markdown`; this module
draws the figures and writes the files.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence

from bitfit_hf.study.budgets import TASKS, Budget
from bitfit_hf.study.figures import plot_bias_change, plot_curve, plot_grid
from bitfit_hf.study.grid import StudySettings
from bitfit_hf.study.markdown import render_markdown
from bitfit_hf.study.results import build_results, constant_predictors, parameter_counts
from bitfit_hf.study.state import CellState
from bitfit_hf.utils.io import write_json_atomic, write_text_atomic

__all__ = ["REPORT_NAME", "RESULTS_NAME", "FIGURES_DIR", "write_report"]

REPORT_NAME = "report.md"
RESULTS_NAME = "results.json"
FIGURES_DIR = "figures"


def write_report(
    output_dir: str,
    states: Sequence[CellState],
    budget: Budget,
    settings: StudySettings,
    command: Optional[str] = None,
    param_counts: Optional[Dict[str, Dict[str, float]]] = None,
    constants: Optional[Dict[str, Dict[str, Any]]] = None,
) -> Dict[str, Any]:
    """Write ``report.md``, ``results.json`` and ``figures/*.png`` into ``output_dir``; returns the results
    (``param_counts`` / ``constants``: given, or computed and cached in ``output_dir``)."""
    if param_counts is None:
        param_counts = parameter_counts(output_dir)
    if constants is None:
        tasks = list(dict.fromkeys(s.cell.task for s in states if s.cell.task in budget.tasks))
        constants = constant_predictors(output_dir, budget, tasks)
    results = build_results(states, budget, settings, param_counts, constants)
    results["study"]["command"] = command
    figures_dir = os.path.join(output_dir, FIGURES_DIR)
    os.makedirs(figures_dir, exist_ok=True)
    figures: Dict[str, str] = {}
    curve = results.get("curve")
    drawn = {
        "grid": plot_grid(results["grid"], results["labels"], os.path.join(figures_dir, "grid.png")),
        "curve": plot_curve(curve, results["labels"], TASKS[curve["task"]].metric_label,
                            os.path.join(figures_dir, "curve.png")) if curve else None,
        "bias_change": plot_bias_change(results["bias_change"]["matrix"], results["bias_change"]["tasks"],
                                        os.path.join(figures_dir, "bias_change.png"))
        if results.get("bias_change") else None,
    }
    for name, path in drawn.items():
        if path:
            figures[name] = os.path.relpath(path, output_dir)
    results["figures"] = figures
    write_json_atomic(os.path.join(output_dir, RESULTS_NAME), results)
    write_text_atomic(os.path.join(output_dir, REPORT_NAME), render_markdown(results, states, figures, command))
    return results
