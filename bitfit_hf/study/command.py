"""The study's command line, shared by ``python -m bitfit_hf.study`` and ``bitfit-hf study``.

    python -m bitfit_hf.study                       # the default budget (about an hour on a 2-core CPU)
    python -m bitfit_hf.study --dry-run             # list the cells and the estimated time
    python -m bitfit_hf.study --budget full --device cuda --model_name_or_path bert-base-uncased
    python -m bitfit_hf.study --report-only         # rebuild report.md from the finished cells
    python -m bitfit_hf.study --lr_scheduler_type constant   # the official BitFit code's constant rate
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from typing import List, Optional, Sequence

from bitfit_hf.study.budgets import BUDGETS, METHOD_ROWS, TASKS
from bitfit_hf.study.grid import StudySettings
from bitfit_hf.study.runner import NOT_AVAILABLE, WAITING, Study, StudyError

__all__ = ["add_arguments", "run", "main"]

DEFAULT_OUTPUT = "outputs/study-{budget}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The study's options (each accepts ``--a_b`` and ``--a-b``)."""

    def option(name: str, **kwargs) -> None:
        spellings = dict.fromkeys([f"--{name}", f"--{name.replace('_', '-')}"])
        parser.add_argument(*spellings, dest=name, **kwargs)

    option("budget", choices=list(BUDGETS), default="default",
           help="default: every claim a 2-core CPU can test (sentiment and POS, within about an hour); gpu: the "
           "paper's four tasks and the SQuAD curve in about 14 minutes on one H200 (--jobs 14); full: the whole GPU grid (hours); "
           "smoke: a few tiny runs that check the machinery")
    option("output_dir", type=os.path.expanduser, default=None, help="where cells, runs and the report go (default outputs/study-<budget>)")
    option("model_name_or_path", type=os.path.expanduser, default=None,
           help="model for every cell (default: all-MiniLM-L6-v2 from its wheel): a path, a Hub id or an offline model "
           "asset (mpnet: all-mpnet-base-v2, base size, with --device cuda)")
    option("device", choices=["auto", "cpu", "cuda"], default="auto",
           help="auto: what the recipes pick (GPU when present); cpu; cuda (fails without a GPU)")
    option("tasks", nargs="+", choices=list(TASKS), default=None, help="only these tasks")
    option("methods", nargs="+", choices=list(METHOD_ROWS), default=None, help="only these method rows")
    option("seeds", nargs="+", type=int, default=None, help="only these seeds")
    option("max_cells", type=int, default=None,
           help="run at most this many pending cells, then write the report (the next invocation goes on)")
    option("jobs", type=int, default=1,
           help="run this many cells at a time (several small runs share one GPU; on a CPU each gets an equal "
           "share of the cores)")
    option("lr_scheduler_type", choices=["linear", "constant"], default=None,
           help="the learning-rate schedule of every run (sweep included): constant, as the official BitFit code, or "
           "linear (decay to 0); default: the recipes' (linear)")
    option("no_sweep", action="store_true",
           help="skip the budget's learning-rate sweep: every row trains at its recipe's default rate")
    option("sweep_factors", nargs="+", type=float, default=None, metavar="F",
           help="the sweep's rates as multiples of each row's recipe default (default: the budget's, e.g. 1 3 10); "
           "e.g. 0.3 1 3 10 when a choice lands on the grid's lowest rate")
    option("recipe_args", default="", help="extra flags for every recipe run, one quoted string (e.g. \"--bf16 True\")")
    option("dry_run", action="store_true", help="list the cells (status, estimate, command) and stop")
    option("report_only", action="store_true", help="rebuild the report from the finished cells; run nothing")
    option("retry_failed", action="store_true", help="run failed cells again (default: keep their failure)")
    option("keep_outputs", action="store_true", help="keep each run's weights (default: only its JSON/logs)")
    option("recipes_dir", type=os.path.expanduser, default=None, help="the folder holding glue.py, pos.py, squad.py (default: the checkout's)")
    option("no_progress", action="store_true", help="no progress bar (one line per finished cell instead)")


def _study(args: argparse.Namespace) -> Study:
    budget = BUDGETS[args.budget]
    if args.sweep_factors is not None:
        if args.no_sweep:
            raise StudyError("--sweep_factors and --no_sweep contradict each other: drop one of them.")
        if budget.sweep is None or any(f <= 0 for f in args.sweep_factors):
            raise StudyError(f"--sweep_factors needs positive multiples of the default rate and a budget with a sweep "
                             f"(got {args.sweep_factors} for budget {budget.name}).")
        budget = dataclasses.replace(budget, sweep=dataclasses.replace(budget.sweep, factors=tuple(args.sweep_factors)))
    if args.no_sweep:
        budget = dataclasses.replace(budget, sweep=None)
    if args.device == "cuda" and not (args.report_only or args.dry_run):  # a report or a plan needs no GPU
        import torch

        if not torch.cuda.is_available():
            raise StudyError("--device cuda: no CUDA device is visible to torch here.")
    settings = StudySettings(
        model_name_or_path=args.model_name_or_path,
        device=args.device,
        recipe_args=tuple(shlex.split(args.recipe_args or "")),
        lr_scheduler_type=args.lr_scheduler_type,
    )
    output_dir = args.output_dir or DEFAULT_OUTPUT.format(budget=budget.name)
    return Study(output_dir, budget, settings, tasks=args.tasks, methods=args.methods, seeds=args.seeds,
                 recipes_dir=args.recipes_dir, retry_failed=args.retry_failed, keep_outputs=args.keep_outputs)


def _dry_run(study: Study) -> None:
    states = study.states()
    width = max(len(s.cell_id) for s in states) if states else 10
    print(f"budget {study.budget.name} ({study.budget.description})")
    print(f"output: {study.output_dir}")
    print(f"{'cell':<{width}}  {'status':<11} {'epochs':>6} {'est. s':>7}  purpose")
    pending_seconds = 0.0
    for state in states:
        estimate = state.cell.estimated_seconds()
        if state.status in ("pending", WAITING):
            pending_seconds += estimate
        status = {"unavailable": "n/a", WAITING: "waiting"}.get(state.status, state.status)
        print(f"{state.cell_id:<{width}}  {status:<11} {state.cell.epochs:>6g} {estimate:>7.0f}  "
              f"{'+'.join(state.cell.purposes)}")
    counts = {}
    for state in states:
        counts[state.status] = counts.get(state.status, 0) + 1
    print(f"\n{len(states)} cells: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    if counts.get("unavailable"):
        missing = sorted({s.cell.row.method for s in states if s.status == "unavailable"})
        print(f"n/a = {NOT_AVAILABLE} (--method {', '.join(missing)})")
    if counts.get(WAITING):
        print(f"waiting = {WAITING} (planned with the rate the sweep chooses; lr? in the name until then)")
    print(f"estimated time of the cells to run: {pending_seconds / 60:.0f} min on an idle 2-core CPU with "
          "all-MiniLM-L6-v2 (a rough cost model from the recipes' measured CPU runs; this budget is meant for "
          f"{study.budget.hardware}: a GPU is faster, a base-size model slower)")
    if states:
        example = next((s for s in states if s.status == "pending"), states[0])
        print("\nexample command:\n  " + " ".join(shlex.quote(a) for a in study.command(
            example.cell, example.cell_id, "<recipes>")))


def _fetch_model_asset(model: Optional[str]) -> None:
    """A model asset named by --model_name_or_path (``mpnet``) is fetched once here, before the cells start,
    rather than by the first cells at once (each would wait on the others' download)."""
    from bitfit_hf.data.assets import ensure_assets, model_asset_name

    name = model_asset_name(model)
    if name is not None:
        ensure_assets([name])


def run(args: argparse.Namespace, argv: Optional[Sequence[str]] = None) -> int:
    """Plan, run the pending cells (unless --dry-run / --report-only), write the report."""
    from bitfit_hf.study.report import REPORT_NAME, write_report

    study = _study(args)
    if args.dry_run:
        _dry_run(study)
        return 0
    started = time.time()
    if args.report_only:
        states = study.states()
    else:
        _fetch_model_asset(args.model_name_or_path)
        states = study.run(progress=not args.no_progress, max_cells=args.max_cells, jobs=args.jobs)
    command = " ".join(shlex.quote(a) for a in (argv if argv is not None else ["python", "-m", "bitfit_hf.study",
                                                                                  *sys.argv[1:]]))
    results = write_report(study.output_dir, states, study.budget, study.settings, command=command)
    print(f"\nreport: {study.output_dir}/{REPORT_NAME} ({time.time() - started:.0f} s this invocation)")
    for claim in results["claims"]:
        print(f"  claim {claim['id']}: {claim['verdict']}: {claim['evidence']}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    from bitfit_hf.utils.errors import EXIT_USER_ERROR, UserError

    parser = argparse.ArgumentParser(prog="python -m bitfit_hf.study",
                                     description="Reproduce the BitFit paper's findings with the library's recipes.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args, ["python", "-m", "bitfit_hf.study", *(argv if argv is not None else sys.argv[1:])])
    except UserError as err:
        print(f"python -m bitfit_hf.study: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted: finished cells are kept; run the same command to resume", file=sys.stderr)
        return 130
