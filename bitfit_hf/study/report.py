"""Write the study's report: ``report.md``, ``results.json`` and the PNG figures, from the cell records.

Everything in it is computed from the records on disk, so the report can be rebuilt at any time
(``--report_only``), and a partial study gives a partial report that says what is missing.
"""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any, Dict, List, Optional, Sequence

from bitfit_hf.study.aggregate import aggregate
from bitfit_hf.study.claims import figure1_ranking, judge_all
from bitfit_hf.study.figures import plot_bias_change, plot_curve, plot_grid
from bitfit_hf.study.grid import TASKS, Budget, StudySettings
from bitfit_hf.study.runner import NOT_AVAILABLE, CellState
from bitfit_hf.utils.io import read_json_object, write_json_atomic, write_text_atomic

__all__ = ["REPORT_NAME", "RESULTS_NAME", "FIGURES_DIR", "build_results", "write_report", "parameter_counts"]

REPORT_NAME = "report.md"
RESULTS_NAME = "results.json"
FIGURES_DIR = "figures"
_COUNTS_CACHE = "param_counts.json"


def environment() -> Dict[str, Any]:
    """Versions and machine: what a reader needs to judge the timings."""
    import torch
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import datasets

        info["datasets"] = datasets.__version__
    except ImportError:  # pragma: no cover
        pass
    return info


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


def build_results(
    states: Sequence[CellState],
    budget: Budget,
    settings: StudySettings,
    param_counts: Optional[Dict[str, Dict[str, float]]],
) -> Dict[str, Any]:
    """``results.json``: the tables, the verdicts and where they came from."""
    results = aggregate(states, budget)
    results["param_counts"] = param_counts
    results["claims"] = judge_all(results)
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
        "cells": counts,
        "cell_wall_s": sum(r.get("wall_s") or 0.0 for r in records),
        "cell_cpu_s": sum(r.get("cpu_s") or 0.0 for r in records),
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
    }
    results["cells"] = [
        {"cell_id": s.cell_id, "task": s.cell.task, "method": s.cell.method, "train_size": s.cell.train_size,
         "seed": s.cell.seed, "status": s.status,
         **({k: s.record.get(k) for k in ("score", "train_score", "train_time_s", "peak_rss_mb", "wall_s", "error")}
            if s.record else {})}
        for s in states
    ]
    return results


# ---- markdown ----------------------------------------------------------------------------------------


def _pm(stat: Optional[Dict[str, Any]], digits: int = 2) -> str:
    if not stat or stat.get("mean") is None:
        return ""
    text = f"{stat['mean']:.{digits}f}"
    if stat["n"] > 1:
        text += f" ± {stat['std']:.{digits}f}"
    return text + f" (n={stat['n']})"


def _cell(entry: Optional[Dict[str, Any]], field: str = "score") -> str:
    if entry is None:
        return "–"
    if entry[field]["mean"] is None:
        return entry["status"]
    text = _pm(entry[field])
    if entry["status"].startswith("partial"):
        text += f" [{entry['status']}]"
    return text


def _table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _grid_section(results: Dict[str, Any]) -> str:
    grid, labels = results["grid"], results["labels"]
    tasks = list(grid)
    methods = list(dict.fromkeys(m for t in tasks for m in grid[t]))
    header = ["method"] + [f"{t} ({TASKS[t].metric_label}, n={next(iter(grid[t].values()))['train_size']})" for t in tasks]
    rows = [[labels.get(m, m)] + [_cell(grid[t].get(m)) for t in tasks] for m in methods]
    return _table(header, rows)


def _curve_section(results: Dict[str, Any]) -> str:
    curve = results.get("curve")
    if not curve:
        return "No training-size curve in this budget."
    sizes = sorted({p["size"] for pts in curve["methods"].values() for p in pts})
    header = ["method"] + [f"n={s}" for s in sizes]
    rows = []
    for method, points in curve["methods"].items():
        by_size = {p["size"]: p for p in points}
        rows.append([results["labels"].get(method, method)] + [_cell(by_size.get(s)) for s in sizes])
    diffs = {p["size"]: p["difference"] for p in curve.get("differences", [])}
    rows.append(["BitFit − full"] + [("" if diffs.get(s) is None else f"{diffs[s]:+.2f}") for s in sizes])
    crossover = curve.get("crossover_size")
    note = (f"Crossover (BitFit − full changes sign, interpolated in log size): **n ≈ {crossover:.0f}**."
            if crossover else "No crossover within the sizes run.")
    return _table(header, rows) + "\n\n" + note


def _bias_section(results: Dict[str, Any]) -> str:
    change = results.get("bias_change")
    if not change:
        return "No bias-change matrix: no BitFit (all biases) run finished."
    ranking = results.get("figure1_ranking") or []
    rows = [[str(i), f"`{role}`", f"{value:.3e}"] for i, (role, value) in enumerate(ranking, start=1)]
    from bitfit_hf.reporting.heatmap import BiasChange

    matrix = BiasChange.from_dict(change["matrix"]).to_markdown()
    return (f"Averaged over {', '.join(change['tasks'])} ({change['runs']} BitFit runs; seeds averaged within a task, "
            f"tasks with equal weight). Metric: (1/dim)·‖b0 − bF‖₁ per bias vector.\n\n"
            + _table(["rank", "role", "mean change per layer"], rows) + "\n\n" + matrix)


def _gap_section(results: Dict[str, Any]) -> str:
    grid, labels = results["grid"], results["labels"]
    rows = []
    for task, entries in grid.items():
        for method, entry in entries.items():
            if entry["gap"]["mean"] is None:
                continue
            rows.append([task, labels.get(method, method), _pm(entry["train_score"]), _pm(entry["score"]),
                         _pm(entry["gap"])])
    if not rows:
        return "No training-set scores recorded."
    return _table(["task", "method", "training-set score", "validation score", "gap (train − validation)"], rows)


def _cost_section(results: Dict[str, Any]) -> str:
    parts = []
    for task, entries in results["costs"].items():
        rows = []
        for method, entry in entries.items():
            label = results["labels"].get(method, method)
            if entry["status"] != "done":
                rows.append([label, entry["status"], "", "", "", ""])
                continue
            params = entry.get("trainable_params")
            percent = entry.get("trainable_percent")
            gpu = entry["gpu_train_peak_mb"]
            memory = _pm(entry["peak_rss_mb"], 0) + (f"; GPU +{gpu['mean']:.0f} MB in training" if gpu["mean"] else "")
            rows.append([
                label,
                "" if params is None else f"{params:,}" + ("" if percent is None else f" ({percent:.3f}%)"),
                _pm(entry["train_time_s"], 1),
                memory,
                _pm(entry["epochs_to_converge"], 1),
                f"{entry['epochs']:g}" if entry.get("epochs") is not None else "",
            ])
        parts.append(f"**{task}** ({TASKS[task].title})\n\n" + _table(
            ["method", "trainable params (% of model)", "training time (s)", "peak RSS (MB)",
             "epochs to converge", "epochs run"], rows))
    return "\n\n".join(parts) if parts else "No finished cells."


def _counts_section(results: Dict[str, Any]) -> str:
    counts = results.get("param_counts") or {}
    rows = [[name, f"{int(c['total_params']):,}", f"{int(c['all_bias_params']):,}", f"{c['all_percent']:.4f}%",
             f"{int(c['paper_subset_bias_params']):,}", f"{c['paper_subset_percent']:.4f}%"] for name, c in counts.items()]
    return _table(["model (config only)", "parameters", "all biases", "%", "b_q + b_m2", "%"], rows)


def _not_run_section(states: Sequence[CellState]) -> str:
    unavailable = sorted({s.cell.row.method for s in states if s.status == "unavailable"})
    failed = [s for s in states if s.status == "failed"]
    pending = [s for s in states if s.status == "pending"]
    lines = []
    if unavailable:
        count = sum(s.status == "unavailable" for s in states)
        lines.append(f"* {count} cell(s) {NOT_AVAILABLE}: `--method {'`, `--method '.join(unavailable)}`.")
    for state in failed:
        lines.append(f"* failed: `{state.cell_id}`: {state.record.get('error', '?')}")
    if pending:
        lines.append(f"* {len(pending)} cell(s) not run yet (the study was stopped or is still running).")
    return "\n".join(lines) if lines else "Every planned cell finished."


def render_markdown(results: Dict[str, Any], states: Sequence[CellState], figures: Dict[str, str],
                    command: Optional[str]) -> str:
    study = results["study"]
    env = study["environment"]
    claims_rows = [[str(c["id"]), c["claim"], f"**{c['verdict']}**", c["evidence"], c["rule"]] for c in results["claims"]]
    cells = ", ".join(f"{n} {status}" for status, n in sorted(study["cells"].items()))
    out = [
        f"# BitFit reproduction study: budget `{study['budget']}`",
        "",
        f"Budget: {study['budget_description']}.",
        "",
        f"* command: `{command}`" if command else "* command: (not recorded)",
        f"* model: {study['model_name_or_path']}; device: {study['device']}"
        + (f"; extra recipe flags: `{' '.join(study['recipe_args'])}`" if study["recipe_args"] else ""),
        f"* machine: {env['platform']}, {env['cpu_count']} CPUs" + (f", GPU {env['cuda']}" if env.get("cuda") else "")
        + f"; python {env['python']}, torch {env['torch']}, transformers {env['transformers']}"
        + (f", datasets {env['datasets']}" if env.get("datasets") else ""),
        f"* cells: {cells}; summed cell wall time {study['cell_wall_s'] / 60:.1f} min "
        f"(CPU time {study['cell_cpu_s'] / 60:.1f} min); report written {study['written_at']}",
        "",
        "## The claims",
        "",
        "Each rule was fixed in `bitfit_hf/study/claims.py` before the run. Scores are validation scores in points "
        "(accuracy × 100, SQuAD F1), means over seeds; tasks are averaged with equal weight.",
        "",
        _table(["#", "claim", "verdict", "deciding numbers", "rule"], claims_rows),
        "",
        "## Method grid (Table 3 style): validation score, mean ± std over seeds",
        "",
        _grid_section(results),
        "",
    ]
    if figures.get("grid"):
        out += [f"![method grid]({figures['grid']})", ""]
    out += ["## Training-set size: BitFit vs full fine-tuning", "", _curve_section(results), ""]
    if figures.get("curve"):
        out += [f"![training-size curve]({figures['curve']})", ""]
    out += ["## Which biases move (Figure 1), averaged over tasks", "", _bias_section(results), ""]
    if figures.get("bias_change"):
        out += [f"![bias change heat map]({figures['bias_change']})", ""]
    out += [
        "## Generalisation gap",
        "",
        "Training-set score: the same metric on the first training examples (those the model trained on), "
        "scored after training with `--do_predict --predict_split train`.",
        "",
        _gap_section(results),
        "",
        "## Cost",
        "",
        "Training time is `train_runtime` minus the evaluations run inside training; peak RSS is the recipe "
        "process's maximum resident memory (model, data and training); epochs to converge: the first epoch whose "
        "validation score is within 1 point of the run's best (runs that evaluated every epoch).",
        "",
        _cost_section(results),
        "",
        "## Claim 1: trainable fraction from model configurations",
        "",
        "Built from transformers' config classes with the published sizes on the meta device (no weights); biases "
        "counted through the library's role tables; bare encoder, no task head.",
        "",
        _counts_section(results),
        "",
        "## Cells not run",
        "",
        _not_run_section(states),
        "",
    ]
    return "\n".join(out)


def write_report(
    output_dir: str,
    states: Sequence[CellState],
    budget: Budget,
    settings: StudySettings,
    command: Optional[str] = None,
    param_counts: Optional[Dict[str, Dict[str, float]]] = None,
) -> Dict[str, Any]:
    """Write ``report.md``, ``results.json`` and ``figures/*.png`` into ``output_dir``; returns the results."""
    if param_counts is None:
        param_counts = parameter_counts(output_dir)
    results = build_results(states, budget, settings, param_counts)
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
