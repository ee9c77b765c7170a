#!/usr/bin/env python
"""The learning-rate sweep behind the recipes' per-method defaults (``DEFAULT_LEARNING_RATES``).

Each cell is one run of ``recipes/glue.py`` on its default budget (all-MiniLM-L6-v2, the first 3,200
movie-review training sentences, 3 epochs, batch 32) with ``--method``, ``--learning_rate`` and
``--seed`` set, scored on a dev split carved from the *training* data (``--dev_split_from_train``: the
last 1,000 training sentences, never among the 3,200 trained on); the reported validation set is never
read. Cells run seed-major (every method and rate on the first seed, then the next), so an interrupted
sweep still leaves a complete one-seed table. Later seeds run only at each method's ``--top`` best rates
of the first seed (a two-stage sweep: the first seed narrows the grid, the second decides between the
finalists on two-seed means); results are appended to a JSONL file as each cell ends, and a
second call skips the cells already there.

    python benchmarks/lr_sweep.py                                 # the whole grid, 2 seeds
    python benchmarks/lr_sweep.py --methods bitfit,adapterbias --seeds 0
    python benchmarks/lr_sweep.py --report                        # only rewrite the table from the JSONL
    python benchmarks/lr_sweep.py --quick                         # a tiny smoke run (not a sweep)
    python benchmarks/lr_sweep.py --methods bitfit,lora,full --seeds 0 --train_file train.csv   # your own data
    python benchmarks/lr_sweep.py --model_name_or_path mpnet --recipe-args '--max_train_samples 1000' --jobs 8
                                                                  # a base-size encoder (on a GPU: minutes)
    python benchmarks/lr_sweep.py --model_name_or_path mpnet --recipe-args '--max_train_samples 1000' --rates default
                                                                  # only the rate each method gets on that model

With ``--train_file`` (csv / tsv / json / jsonl with one or two text columns and a ``label`` column, as
``recipes/glue.py`` reads it) every cell trains on that file instead of the offline default data (all of it: the
3,200-sentence cap is the default data's only), and is scored on its last ``--dev-size`` rows, or on
``--validation_file`` when given (a dev set of your own; keep a test set apart from it). ``--model_name_or_path``
trains another base (a Hub id, a folder, or ``mpnet``). Results then go to ``outputs/lr_sweep-<train file's or
model's name>.jsonl`` unless ``--results`` says otherwise: never into the committed measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
from typing import Dict, List, Optional

from baselines import dev_split_majority

from bitfit_hf.utils import cell_runs
from bitfit_hf.utils.cell_runs import append_row, read_rows

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECIPE = os.path.join(ROOT, "recipes", "glue.py")

#: Rates tried per method, about a decade around the folklore value; ``adapterbias_shared`` is
#: ``--method adapterbias --share_alpha``. 1e-2 was added for ``bitfit``, ``adapterbias`` and ``lora`` after their
#: seed-0 best came out at the largest rate tried (3e-3): a best rate on the grid's edge is not a choice.
#: ``bitfit_lora`` starts at 1e-3 for the same reason (both of its parts chose 3e-3 or more on seed 0), and
#: 3e-2 was added for ``bitfit`` and ``adapterbias`` when 1e-2 came out best on seed 0 (``lora`` fell at 1e-2),
#: and likewise ``full`` 2e-4, ``frozen`` 3e-2, ``adapterbias_shared`` 3e-2, the random baselines' 3e-2 and then
#: ``rand_uniform``'s 1e-1, the (IA)³ rows' 3e-2 and then ``ia3``'s 1e-1 (their seed-0 best was the top rate).
GRID: Dict[str, List[float]] = {
    "bitfit": [3e-4, 1e-3, 3e-3, 1e-2, 3e-2],
    "adapterbias": [1e-4, 1e-3, 3e-3, 1e-2, 3e-2],
    "lora": [5e-4, 1e-3, 3e-3, 1e-2],
    "bitfit_lora": [1e-3, 3e-3, 1e-2],
    "full": [2e-5, 5e-5, 1e-4, 2e-4],
    "frozen": [1e-3, 3e-3, 1e-2, 3e-2],
    "adapterbias_shared": [1e-3, 3e-3, 1e-2, 3e-2],
    "rand_uniform": [1e-3, 3e-3, 1e-2, 3e-2, 1e-1],
    "rand_row_col": [1e-3, 3e-3, 1e-2, 3e-2],
    "ia3": [1e-3, 3e-3, 1e-2, 3e-2, 1e-1],
    "bitfit_ia3": [1e-3, 3e-3, 1e-2, 3e-2],
}


#: A method registered without a row above: the rates every row draws from.
DEFAULT_RATES = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2]
#: Rows that are a method with a flag: row -> its recipe flags (a results key of the committed table).
VARIANTS = {"adapterbias_shared": ["--method", "adapterbias", "--share_alpha"]}


def sweep_methods() -> List[str]:
    """Every row: the grid's, then any recipes' ``--method`` registered since (rated over :data:`DEFAULT_RATES`)."""
    from bitfit_hf.tuners import recipe_methods

    return [*GRID, *(name for name in recipe_methods() if name not in GRID)]


def rates(method: str) -> List[float]:
    return GRID.get(method, DEFAULT_RATES)


def chosen_rates(method: str, wanted: Optional[List], model: Optional[str] = None) -> List[float]:
    """The row's grid, or (``--rates``) only the rates named: numbers from the grid or off it, and ``default`` for
    the rate the recipe picks for ``model`` (its width decides). A partial sweep answers "does this rate train here"
    before the whole grid runs."""
    if not wanted:
        return rates(method)
    picked = []
    for item in wanted:
        rate = recipe_default(method, model) if item == "default" else float(item)
        if rate is not None and rate not in picked:
            picked.append(rate)
    return picked


def method_flags(method: str) -> List[str]:
    return list(VARIANTS.get(method, ["--method", method]))


def cell_key(method: str, rate: float, seed: int) -> str:
    return f"{method}|{rate:g}|{seed}"


def read_results(path: str) -> Dict[str, dict]:
    return read_rows(path, lambda row: cell_key(row["method"], row["learning_rate"], row["seed"]))


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """``--train_file`` / ``--validation_file`` / ``--model_name_or_path`` / ``--recipe-args``: compare the methods on
    the user's own data, base and budget (passed to the recipe)."""
    parser.add_argument("--model_name_or_path", default=None,
                        help="train this base (Hub id, folder, or mpnet) instead of the recipe's all-MiniLM-L6-v2")
    parser.add_argument("--train_file", default=None,
                        help="train on this csv / tsv / json / jsonl file (one or two text columns and a label column, as "
                             "recipes/glue.py reads it) instead of the offline movie-review data")
    parser.add_argument("--validation_file", default=None, help="score on this file (same formats)")
    parser.add_argument("--recipe-args", default="",
                        help="more recipe flags for every cell, e.g. '--max_train_samples 1000' (a budget the CPU can run "
                             "on a base-size model) or '--tf32 True'; recorded with each row like the data flags")


def data_flags(parser: argparse.ArgumentParser, args: argparse.Namespace, needs_validation: bool) -> List[str]:
    """The recipe's base and data flags for the user's own base and files (local paths made absolute), then the
    ``--recipe-args``; none: the recipe's defaults. Missing files and a half-given pair are the parser's one-line errors, before any run starts."""
    if args.validation_file and not args.train_file:
        parser.error("--validation_file scores runs trained on --train_file: give both (or neither, for the offline "
                     "default data).")
    if needs_validation and args.train_file and not args.validation_file:
        parser.error("--train_file needs --validation_file here: every method is scored on it.")
    flags: List[str] = []
    if args.model_name_or_path:
        model = args.model_name_or_path
        flags += ["--model_name_or_path", os.path.abspath(model) if os.path.isdir(model) else model]
    for name in ("train_file", "validation_file"):
        path = getattr(args, name)
        if path:
            if not os.path.isfile(path):
                parser.error(f"--{name} {path}: no such file.")
            flags += [f"--{name}", os.path.abspath(path)]
    return flags + shlex.split(getattr(args, "recipe_args", "") or "")


def check_results_data(parser: argparse.ArgumentParser, rows: Dict[str, dict], flags: List[str], path: str) -> None:
    """A results file is resumed only with the data its rows were measured on (a cell is keyed on method, rate and
    seed, not on the data): another data set's rows would be skipped as done and mixed into the table."""
    other = sorted({tuple(row.get("data", ())) for row in rows.values()} - {tuple(flags)})
    if other:
        parser.error(f"{path} holds runs on other data ({shlex.join(other[0]) or 'the offline default data'}); pass "
                     "--results with another file.")


def rows_data(rows: Dict[str, dict]) -> List[str]:
    """The data flags the rows were measured with (none for the offline default data)."""
    return next((list(row["data"]) for row in rows.values() if row.get("data")), [])


def run_cell(method: str, rate: float, seed: int, dev_size: Optional[int], threads: int, extra: List[str],
             data: Optional[List[str]] = None, stop=None) -> dict:
    """One recipe run at ``rate``; scored on the last ``dev_size`` training examples, or (``dev_size`` None) on the
    ``--validation_file`` among ``data``."""
    data = data or []
    dev = ["--dev_split_from_train", str(dev_size)] if dev_size else []
    flags = [*method_flags(method), "--learning_rate", f"{rate:g}", "--seed", str(seed), *data, *dev,
             "--eval_before_training", "false", "--save_strategy", "no", "--report_to", "none", *extra]
    with tempfile.TemporaryDirectory(prefix="lr_sweep_") as out:
        run = cell_runs.run_recipe_cell(RECIPE, flags, out, name=f"{method} lr={rate:g} seed={seed}", threads=threads,
                                        stop=stop)
        with open(os.path.join(out, "all_results.json"), encoding="utf-8") as handle:
            results = json.load(handle)
    if "eval_accuracy" not in results:
        raise RuntimeError(f"cell {method} lr={rate:g} seed={seed} reported no accuracy (metrics: "
                           f"{', '.join(k for k in results if k.startswith('eval_'))}): the sweep compares "
                           "classification accuracy, and float labels make the recipe a regression.")
    row = {"method": method, "learning_rate": rate, "seed": seed, "dev_accuracy": results["eval_accuracy"],
           "train_loss": results.get("train_loss"), "seconds": round(run.wall_s, 1),
           "command": shlex.join(["python", "recipes/glue.py", *flags])}
    if data:
        row["data"] = data
    return row


def best_rates(rows: Dict[str, dict]) -> Dict[str, dict]:
    """Per method: mean dev accuracy of each rate over the seeds run, and the best rate among the rates run on
    the most seeds (the finalists of a two-stage sweep; ties: the lower rate)."""
    table: Dict[str, dict] = {}
    for row in rows.values():
        table.setdefault(row["method"], {}).setdefault(row["learning_rate"], []).append(row["dev_accuracy"])
    out = {}
    for method, by_rate in table.items():
        means = {rate: statistics.mean(scores) for rate, scores in by_rate.items()}
        most_seeds = max(len(scores) for scores in by_rate.values())
        finalists = sorted(rate for rate, scores in by_rate.items() if len(scores) == most_seeds)
        best = max(finalists, key=lambda rate: means[rate])
        out[method] = {"by_rate": by_rate, "means": means, "best": best}
    return out


def default_gap(rows: Dict[str, dict], method: str, default: Optional[float]) -> str:
    """How far ``default`` falls behind the method's other rates, each compared like for like on the seeds both
    ran (a rate run on seed 0 alone is weighed against the default's seed-0 score, not its two-seed mean): the
    largest shortfall, as "-0.3 vs 0.001 (seed 0)", or "best" when no rate beats it; "not run" without its cells."""
    scores: Dict[float, Dict[int, float]] = {}
    for row in rows.values():
        if row["method"] == method:
            scores.setdefault(row["learning_rate"], {})[row["seed"]] = row["dev_accuracy"]
    if default not in scores:
        return "not run"
    worst = None
    for rate, by_seed in scores.items():
        shared = sorted(set(by_seed) & set(scores[default]))
        if rate == default or not shared:
            continue
        gap = statistics.mean(scores[default][s] - by_seed[s] for s in shared)
        if worst is None or gap < worst[0]:
            worst = (gap, rate, shared)
    if worst is None or worst[0] >= 0:
        return "best"
    gap, rate, shared = worst
    return f"{gap * 100:+.1f} vs {rate:g} (seed{'s' if len(shared) > 1 else ''} {', '.join(map(str, shared))})"


def flag_value(flags: Optional[List[str]], flag: str) -> Optional[str]:
    """The value given to ``flag`` among recipe flags (None when absent)."""
    flags = list(flags or [])
    return flags[flags.index(flag) + 1] if flag in flags else None


def model_of(data: Optional[List[str]]) -> Optional[str]:
    """The ``--model_name_or_path`` among a row's data flags (None: the recipe's default model)."""
    return flag_value(data, "--model_name_or_path")


def recipe_default(method: str, model: Optional[str]) -> Optional[float]:
    """The rate ``recipes/glue.py --method M`` picks for ``model`` without ``--learning_rate`` (its width decides)."""
    from bitfit_hf.recipe_kit.args import default_rate_for_model
    from bitfit_hf.tuners import recipe_methods

    recipe = recipe_methods().get(method_flags(method)[1])
    if recipe is None:
        return None
    rate, _ = default_rate_for_model(recipe, recipe.default_learning_rate, model, "minilm")
    return rate


def dev_majority(rows: Dict[str, dict]) -> Optional[float]:
    """The majority class's share of the dev split the rows were scored on, when it is the offline data's (carved by
    ``--dev_split_from_train``); None for the user's own files."""
    if not rows or any("--train_file" in row.get("data", ()) for row in rows.values()):
        return None
    size = flag_value(shlex.split(next(iter(rows.values())).get("command", "")), "--dev_split_from_train")
    return None if size is None else dev_split_majority(int(size))


def markdown(rows: Dict[str, dict], machine: str, data: Optional[List[str]] = None) -> str:
    summary = best_rates(rows)
    if "--train_file" in (data or []):
        scored = ("the validation file" if "--validation_file" in data else
                  "the training file's last rows, never trained on (`--dev_split_from_train`: the count is in each "
                  "row's command in the JSONL)")
        cell = (f"Each cell: `python recipes/glue.py --method M --learning_rate R --seed S {shlex.join(data)} ...` (the "
                f"whole training file, 3 epochs, batch 32), scored on {scored}. ")
    elif data:
        budget = ("the default data, 3 epochs, batch 32, with the flags shown" if "--max_train_samples" in data else
                  "the default data and budget: 3,200 training sentences, 3 epochs, batch 32")
        cell = (f"Each cell: `python recipes/glue.py --method M --learning_rate R --seed S {shlex.join(data)} "
                f"--dev_split_from_train 1000 ...` ({budget}), scored on the last 1,000 training sentences, never the "
                "validation set. ")
    else:
        cell = ("Each cell: `python recipes/glue.py --method M --learning_rate R --seed S --dev_split_from_train 1000 "
                "--eval_before_training false --save_strategy no --report_to none` (the default budget: 3,200 training "
                "sentences, 3 epochs, batch 32), scored on the last 1,000 training sentences, never the validation set. ")
    lines = ["Made by `python benchmarks/lr_sweep.py` (resumable; `--report` rewrites this file). " + cell +
             "Every rate runs on the first seed; the second seed runs only at each method's two best rates of the "
             "first, and the best is chosen among those on the two-seed mean. *default*: the rate the recipes pick "
             "for this model without `--learning_rate`; *default vs the rest*: its largest shortfall in points "
             "against any other rate run, the two compared on the seeds both ran.",
             ""]
    majority = dev_majority(rows)
    if majority is not None:
        lines += [f"Majority class of the dev split: **{majority * 100:.1f}%** (the constant predictor).", ""]
    lines += ["| method | rate: dev accuracy (mean over seeds; each seed) | best | default | default vs the rest |",
              "| --- | --- | --- | --- | --- |"]
    model = model_of(data)
    for method in [m for m in sweep_methods() if m in summary]:
        entry = summary[method]
        cells = []
        for rate in sorted(entry["by_rate"]):
            scores = entry["by_rate"][rate]
            each = ", ".join(f"{s * 100:.1f}" for s in scores)
            mark = "**" if rate == entry["best"] else ""
            cells.append(f"{mark}{rate:g}: {entry['means'][rate] * 100:.1f}{mark} ({each})")
        default = recipe_default(method, model)
        lines.append(f"| `{method}` | " + "; ".join(cells) + f" | {entry['best']:g} | "
                     f"{'-' if default is None else f'{default:g}'} | "
                     f"{'-' if default is None else default_gap(rows, method, default)} |")
    seeds = sorted({row["seed"] for row in rows.values()})
    lines.append("")
    lines.append(f"{len(rows)} runs, seeds {', '.join(map(str, seeds))}; {machine}.")
    return "\n".join(lines) + "\n"


def finalist_rates(done: Dict[str, dict], method: str, seed: int, top: int,
                   candidates: Optional[List[float]] = None) -> List[float]:
    """The ``top`` rates of ``method`` with the best dev accuracy on ``seed`` (every rate when ``top`` is 0), among
    ``candidates`` (default: the method's grid)."""
    scored = [(done[cell_key(method, rate, seed)]["dev_accuracy"], rate) for rate in (candidates or rates(method))
              if cell_key(method, rate, seed) in done]
    ranked = [rate for _, rate in sorted(scored, key=lambda pair: -pair[0])]
    return ranked if top <= 0 else ranked[:top]


def default_paths(args, name: str) -> None:
    """Fill ``args.results`` / ``args.markdown`` when not given: ``results/NAME.jsonl`` and its ``.md``; for a
    ``--quick`` smoke run a file in the temporary directory, and for the user's own ``--train_file``, base or
    ``--recipe-args`` one in ``outputs/`` named after it (never the committed measurements)."""
    if args.results is None:
        own = getattr(args, "train_file", None) or getattr(args, "model_name_or_path", None)
        if args.quick:
            args.results = os.path.join(tempfile.gettempdir(), f"{name}_quick.jsonl")
        elif own or getattr(args, "recipe_args", ""):
            stem = os.path.basename((own or "custom").rstrip("/")).split(".")[0] or "data"
            args.results = os.path.join("outputs", f"{name}-{stem}.jsonl")
        else:
            args.results = os.path.join(HERE, "results", f"{name}.jsonl")
    if args.markdown is None:
        args.markdown = os.path.splitext(args.results)[0] + ".md"


def write_table(path: str, table: str) -> None:
    """Write the markdown table atomically (a reader never sees half of it)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(table)
    os.replace(path + ".tmp", path)


def machine_line() -> str:
    import torch
    import transformers

    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}, transformers {transformers.__version__}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    known = sweep_methods()
    parser.add_argument("--methods", default=",".join(known), help="comma-separated, from: " + ", ".join(known))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--dev-size", type=int, default=1000,
                        help="training examples carved off the end as the dev split (not with --validation_file)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / jobs)")
    parser.add_argument("--rates", default=None,
                        help="comma-separated: run only these rates of each method (numbers, or 'default': the rate the "
                             "recipe picks for the sweep's model); the table shows the rates run")
    parser.add_argument("--top", type=int, default=2,
                        help="later seeds run only at each method's TOP best rates on the first seed (0: every rate)")
    parser.add_argument("--jobs", type=int, default=1, help="cells run side by side")
    parser.add_argument("--results", default=None, help="JSONL of finished runs (default: results/lr_sweep.jsonl; "
                        "with --quick, a file in the temporary directory)")
    parser.add_argument("--markdown", default=None, help="the table (default: beside the results, .md)")
    parser.add_argument("--report", action="store_true", help="only rewrite the markdown table from the results")
    parser.add_argument("--quick", action="store_true", help="smoke run: one tiny cell per method, results elsewhere")
    add_data_arguments(parser)
    args = parser.parse_args(argv)
    data = data_flags(parser, args, needs_validation=False)
    default_paths(args, "lr_sweep")

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in known]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; known: {', '.join(known)}")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    wanted = None
    if args.rates:
        wanted = []
        for item in (r.strip() for r in args.rates.split(",") if r.strip()):
            try:
                wanted.append(item if item == "default" else float(item))
            except ValueError:
                parser.error(f"--rates: {item!r} is neither a number nor 'default'.")
    model = model_of(data)
    extra: List[str] = []
    if args.quick:
        extra = ["--max_train_samples", "32", "--max_steps", "2"]
        args.dev_size = 16
    dev_size = None if args.validation_file else args.dev_size
    done = read_results(args.results)
    if not args.report:
        check_results_data(parser, done, data, args.results)
    threads = args.threads or cell_runs.cores_per_job(args.jobs)
    if not args.report:
        todo = [(method, rate, seed) for method in methods
                for rate in (rates(method)[1:2] if args.quick else chosen_rates(method, wanted, model))
                for seed in seeds[:1] if cell_key(method, rate, seed) not in done]

        def one(cell, stop):
            return run_cell(*cell, dev_size, threads, extra, data, stop)

        def finished(cell, row):
            method, rate, seed = cell
            append_row(args.results, row)
            done[cell_key(method, rate, seed)] = row
            print(f"{method:20s} lr={rate:<8g} seed={seed}  dev accuracy {row['dev_accuracy'] * 100:.1f}  "
                  f"({row['seconds']:.0f} s)", flush=True)

        cell_runs.run_cells(todo, one, jobs=max(1, args.jobs), finished=finished)
        finalists = {method: finalist_rates(done, method, seeds[0], args.top, chosen_rates(method, wanted, model))
                      for method in methods}
        later = [(method, rate, seed) for seed in seeds[1:] for method in methods
                 for rate in (rates(method)[1:2] if args.quick else finalists[method])
                 if cell_key(method, rate, seed) not in done]
        cell_runs.run_cells(later, one, jobs=max(1, args.jobs), finished=finished)
    table = markdown(done, machine_line(), rows_data(done))
    write_table(args.markdown, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
