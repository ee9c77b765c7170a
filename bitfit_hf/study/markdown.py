"""The study's ``report.md``: the assembled results (:mod:`bitfit_hf.study.results`) rendered as markdown.

Only presentation lives here (tables, ± notation, section prose): every number it prints is already in
``results.json``, so the two never disagree.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from bitfit_hf.study import claims as rules
from bitfit_hf.study.budgets import TASKS
from bitfit_hf.study.claims import figure1_ranking
from bitfit_hf.study.gates import FIT_FRACTION, VALID_MARGIN, fit_threshold, threshold
from bitfit_hf.study.machine import describe
from bitfit_hf.study.state import NOT_AVAILABLE, WAITING, CellState

__all__ = ["render_markdown", "machine_lines"]


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
    rows = [[labels.get(m, m)] + [_cell(grid[t].get(m)) + _rate(grid[t].get(m)) for t in tasks] for m in methods]
    constants = results.get("constants") or {}
    rows.append(["constant predictor"] + [_constant(constants.get(t), "validation") for t in tasks])
    return _table(header, rows)


def _rate(entry: Optional[Dict[str, Any]]) -> str:
    return "" if not entry or entry.get("learning_rate") is None else f" @ lr {entry['learning_rate']:g}"


def _constant(constant: Optional[Dict[str, Any]], split: str) -> str:
    if not constant:
        return "–"
    if constant.get("error"):
        return f"unknown ({constant['error'][:120]})"
    part = constant.get(split)
    if not part:
        return "–"
    return f"{part['score']:.2f} (n={part['n']}" + (f", k={part['k']}" if part.get("k") else "") + ")"


def _rules_section(results: Dict[str, Any]) -> str:
    texts = results["rules"]
    lines = [f"* {texts[name][0].upper()}{texts[name][1:]}." for name in ("gate", "fit", "noise", "combine", "sweep")]
    lines.append("* Constants: " + ", ".join(f"`{k}` = {v:g}" for k, v in texts["constants"].items()) + ".")
    return "\n".join(lines)


def _constants_section(results: Dict[str, Any]) -> str:
    constants = results.get("constants") or {}
    if not constants:
        return "No constant-predictor scores: every comparison is not testable here."
    rows = []
    for task, constant in constants.items():
        validation = (constant.get("validation") or {}).get("score")
        train = (constant.get("train") or {}).get("score")
        rows.append([
            task, constant.get("rule", ""), _constant(constant, "validation"), _constant(constant, "train"),
            _constant(constant, "dev"), "" if validation is None else f"> {threshold(validation):.2f}",
            "" if train is None else f">= {fit_threshold(train):.2f}",
        ])
    return _table(["task", "constant predictor", "validation score", "training-set score", "sweep dev score",
                   "valid run: validation score", "fits: training-set score"], rows)


def _sweep_section(results: Dict[str, Any]) -> str:
    sweep = results.get("sweep") or []
    if not sweep:
        return "No learning-rate sweep in this budget: every row trains at its recipe's default rate."
    labels = results["labels"]
    rows = []
    for entry in sweep:
        tried = []
        for rate in entry["rates"]:
            scores = ", ".join(f"{r['score']:.2f}" for r in rate["runs"])
            mean = "–" if rate["mean"] is None else f"{rate['mean']:.2f}"
            mark = "**" if rate["rate"] == entry["chosen"] else ""
            failed = f", {len(rate['failed'])} failed" if rate["failed"] else ""
            tried.append(f"{mark}{rate['rate']:g}: {mean}{mark}" + (f" ({scores}{failed})" if scores or failed else ""))
        chosen = "" if entry["chosen"] is None else f"{entry['chosen']:g}" + (" (grid edge)" if entry["edge"] else "")
        rows.append([entry["task"], labels.get(entry["row"], entry["row"]), "; ".join(tried), chosen or entry["status"]])
    return _table(["task", "method", "rate: mean dev score (each seed)", "chosen"], rows)


def _validity_section(results: Dict[str, Any]) -> str:
    rows = []
    labels = results["labels"]
    for item in results.get("validity") or []:
        marks = []
        for run in item["runs"]:
            mark = "" if run["valid"] is None else (" ✓" if run["valid"] else " ✗")
            fit = "" if "fits" not in run else (", fits" if run["fits"] else ", does not fit")
            marks.append(f"s{run['seed']} {run['score']:.2f}{mark}{fit}")
        limit = "?" if item["constant"] is None else f"> {threshold(item['constant']):.2f}"
        rows.append([item["task"], labels.get(item["row"], item["row"]), str(item["size"]), limit, "; ".join(marks)])
    if not rows:
        return "No finished runs."
    return _table(["task", "method", "n", "valid when", "seeds: validation score (✓ valid, ✗ not)"], rows)


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
    note = (f"Crossover (BitFit − full turns from + to −, interpolated in log size, over the sizes whose runs pass the "
            f"validity gate): **n ≈ {crossover:.0f}**." if crossover
            else "No crossover (no change of sign from + to − over the sizes whose runs pass the validity gate).")
    return _table(header, rows) + "\n\n" + note


def _bias_section(results: Dict[str, Any]) -> str:
    change = results.get("bias_change")
    if not change:
        return "No bias-change matrix: no BitFit (all biases) run finished."
    ranking = results.get("figure1_ranking") or []
    rows = [[str(i), f"`{role}`", f"{value:.3e}"] for i, (role, value) in enumerate(ranking, start=1)]
    from bitfit_hf.reporting.heatmap import BiasChange

    matrix = BiasChange.from_dict(change["matrix"]).to_markdown()
    per_task = [[task, " > ".join(f"`{role}` {value:.2e}" for role, value in figure1_ranking({"matrix": m}))]
                for task, m in (change.get("per_task") or {}).items()]
    return (f"Averaged over {', '.join(change['tasks'])} ({change['runs']} BitFit runs at each task's main training "
            f"size; seeds averaged within a task, tasks with equal weight). Metric: (1/dim)·‖b0 − bF‖₁ per bias "
            "vector. Claim 6 is judged per task (second table), since tasks train at different rates."
            + (f" Left out of the average: {', '.join(change['left_out'])} (its BitFit runs do not pass the validity "
               "gate; its ranking is in the second table)." if change.get("left_out") else "") + "\n\n"
            + _table(["rank", "role", "mean change per layer"], rows) + "\n\n"
            + _table(["task", "ranking (mean change per layer)"], per_task) + "\n\n" + matrix)


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
                rows.append([label, entry["status"], "", "", "", "", "", ""])
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
                _pm(entry.get("final_train_loss"), 3),
                "default" if entry.get("learning_rate") is None else f"{entry['learning_rate']:g}",
            ])
        parts.append(f"**{task}** ({TASKS[task].title})\n\n" + _table(
            ["method", "trainable params (% of model)", "training time (s)", "peak RSS (MB)",
             "epochs to converge", "epochs run", "final training loss", "learning rate"], rows))
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
    waiting = [s for s in states if s.status == WAITING]
    lines = []
    if unavailable:
        count = sum(s.status == "unavailable" for s in states)
        lines.append(f"* {count} cell(s) {NOT_AVAILABLE}: `--method {'`, `--method '.join(unavailable)}`.")
    for state in failed:
        lines.append(f"* failed: `{state.cell_id}`: {state.record.get('error', '?')}")
    if pending:
        lines.append(f"* {len(pending)} cell(s) not run yet (the study was stopped or is still running).")
    if waiting:
        lines.append(f"* {len(waiting)} cell(s) {WAITING} (their rows' sweep has not finished, or every rate failed).")
    return "\n".join(lines) if lines else "Every planned cell finished."


def _judged_line(claims: Sequence[Dict[str, Any]]) -> str:
    judged = [c["id"] for c in claims if c["verdict"] != rules.NOT_TESTABLE]
    return f"Judged (not \"{rules.NOT_TESTABLE}\"): {len(judged)} of {len(claims)} claims."


def machine_lines(study: Dict[str, Any]) -> List[str]:
    """Where the cells ran (from their records) and, when the report was written elsewhere, where that was."""
    here, ran = study["environment"], study.get("cell_environments") or []
    if not ran or (len(ran) == 1 and ran[0]["environment"] == here):
        return [f"* machine: {describe(here)}"]
    return ([f"* cells ran on: {describe(entry['environment'])} ({entry['cells']} cells)" for entry in ran]
            + [f"* report written on: {describe(here)}"])


def render_markdown(results: Dict[str, Any], states: Sequence[CellState], figures: Dict[str, str],
                    command: Optional[str]) -> str:
    """``report.md``'s text: the claims and the rules first, then each table, with the figures that were drawn."""
    study = results["study"]
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
        "* learning-rate schedule: " + ("constant (as the official BitFit code)" if study.get("lr_scheduler_type") ==
                                        "constant" else (study.get("lr_scheduler_type") or "linear decay to 0 (the "
                                                                                            "recipes' default)")),
        *machine_lines(study),
        f"* cells: {cells}; summed cell wall time {study['cell_wall_s'] / 60:.1f} min "
        f"(CPU time {study['cell_cpu_s'] / 60:.1f} min); report written {study['written_at']}",
        "",
        "## The claims",
        "",
        "Each rule was fixed in code before the run (`bitfit_hf/study/claims.py`, `gates.py`, `compare.py`). Scores "
        "are validation scores in points (accuracy × 100, SQuAD F1); each comparison is paired seed by seed within a "
        "task and counts only on runs that pass the validity gate (below). "
        + _judged_line(results["claims"]),
        "",
        _table(["#", "claim", "verdict", "deciding numbers", "rule"], claims_rows),
        "",
        "### The rules",
        "",
        _rules_section(results),
        "",
        "## Constant predictors and the validity gate",
        "",
        "The best input-blind answer on the very examples a run is scored on (`bitfit_hf/study/baselines.py`): a run "
        f"is valid when its validation score is more than {VALID_MARGIN:g} points above it; it fits its training set "
        f"when its training-set score closes {FIT_FRACTION:g} of the distance from the constant's training-set score "
        "to 100.",
        "",
        _constants_section(results),
        "",
        _validity_section(results),
        "",
        "## Learning-rate sweep",
        "",
        "Each swept row at each rate, trained on the task's training subset and scored on a dev split carved from the "
        "training data (`--dev_split_from_train`); the main runs train at the chosen rate (bold).",
        "",
        _sweep_section(results),
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
        "validation score is within 1 point of the run's best (runs that evaluated every epoch); final training loss: "
        "the last logged training loss (every run).",
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
