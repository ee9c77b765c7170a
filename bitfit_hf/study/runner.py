"""Run the study's cells as recipe subprocesses (one at a time, or --jobs at once), resumably.

Each cell is ``python recipes/<recipe>.py <flags> --output_dir <study>/runs/<cell id>``: the recipes'
own code path, in a fresh process, launched by :mod:`bitfit_hf.utils.cell_runs` as the benchmarks'
cells are (so one cell's memory peak is its own, read with ``wait4``, and the child dies with the study:
``PR_SET_PDEATHSIG`` on Linux). When it exits, its record is written atomically to
``<study>/cells/<cell id>.json``; a re-run skips every cell that has a record, so a killed study loses at
most the cells that were running, and a cell whose run directory exists without a record is simply run
again from scratch.

Cells whose ``--method`` this build's recipes do not accept are never started: they are reported as
"not run: method not available in this build", and run on the first invocation after the method lands.

With a learning-rate sweep in the budget, its cells run first; the main cells of a swept row are
planned (their command, so their identity, holds the chosen rate) once the row's sweep has finished, so
one invocation runs in rounds: whatever is pending, then what the finished sweep made runnable.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shutil
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence

from bitfit_hf.study.budgets import Budget
from bitfit_hf.study.grid import Cell, StudySettings, plan, sweep_plan
from bitfit_hf.study.machine import environment
from bitfit_hf.study.outcome import read_outcome
from bitfit_hf.study.state import NOT_AVAILABLE, WAITING, CellState
from bitfit_hf.study.sweep import choose_rates, chosen_rates
from bitfit_hf.utils import cell_runs
from bitfit_hf.utils.cell_runs import RECIPES_ENV
from bitfit_hf.utils.errors import UserError
from bitfit_hf.utils.io import read_json_object, write_json_atomic

logger = logging.getLogger(__name__)

__all__ = [
    "StudyError",
    "CellState",
    "NOT_AVAILABLE",
    "WAITING",
    "available_methods",
    "find_recipes_dir",
    "RECIPES_ENV",
    "Study",
]

RECORD_FORMAT = 1
_KEEP_SUFFIXES = (".json", ".md", ".png", ".txt")
_DROP_NAMES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt"}
_KEEP_MAX_BYTES = 2 * 2**20


class StudyError(UserError):
    """A study cannot start or continue: bad options, no recipes folder, a study already running there."""


def available_methods() -> frozenset:
    """The ``--method`` values this build's recipes accept."""
    from bitfit_hf.recipe_kit.args import METHODS

    return frozenset(METHODS)


def find_recipes_dir(explicit: Optional[str] = None) -> str:
    """The recipes folder (:func:`bitfit_hf.utils.cell_runs.find_recipes_dir`), its absence a study error."""
    try:
        return cell_runs.find_recipes_dir(explicit)
    except cell_runs.RecipesNotFound as err:
        raise StudyError(f"{err} The study's --recipes_dir names one too.") from None


def _error_line(log_path: str) -> str:
    """The recipe's ``error:`` line, else the last non-empty lines of its log."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            lines = [line.rstrip() for line in handle if line.strip()]
    except OSError:
        return "(no log)"
    for line in reversed(lines):
        if line.startswith("error:") or ": error:" in line:
            return line
    return " | ".join(lines[-3:]) if lines else "(empty log)"


def _prune(run_dir: str) -> None:
    """Drop weights and checkpoints from a finished run; keep its small JSON / text / PNG outputs."""
    for root, dirs, files in os.walk(run_dir):
        for name in list(dirs):
            if name.startswith("checkpoint-"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                dirs.remove(name)
        for name in files:
            path = os.path.join(root, name)
            if name in _DROP_NAMES or not name.endswith(_KEEP_SUFFIXES) or os.path.getsize(path) > _KEEP_MAX_BYTES:
                os.remove(path)


@contextlib.contextmanager
def _exclusive(folder: str) -> Iterator[None]:
    """Hold ``<folder>/.study.lock`` so two studies never write the same folder (released on death)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, ".study.lock")
    handle = open(path, "a+")
    try:
        try:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # pragma: no cover - not POSIX: no lock
            pass
        except OSError:
            raise StudyError(f"another study is running in {folder} (it holds {path}); wait for it or use another "
                             "--output_dir.") from None
        yield
    finally:
        handle.close()


class Study:
    """A budget's cells under one output folder: their states, running the pending ones, and the records."""

    def __init__(
        self,
        output_dir: str,
        budget: Budget,
        settings: StudySettings,
        tasks: Optional[Sequence[str]] = None,
        methods: Optional[Sequence[str]] = None,
        seeds: Optional[Sequence[int]] = None,
        recipes_dir: Optional[str] = None,
        retry_failed: bool = False,
        keep_outputs: bool = False,
        python: Optional[str] = None,
    ):
        self.output_dir = os.path.abspath(output_dir)
        self.budget = budget
        self.settings = settings
        self.tasks, self.methods, self.seeds = tasks, methods, seeds
        self.sweep_cells = sweep_plan(budget, tasks, methods)
        plan(budget, tasks, methods, seeds)  # unknown task or row names fail here, before anything runs
        self._recipes_dir = recipes_dir
        self.retry_failed = retry_failed
        self.keep_outputs = keep_outputs
        self.python = python or sys.executable
        self._environment: Optional[Dict[str, Any]] = None

    # ---- where things live --------------------------------------------------------------------------
    def record_path(self, cell_id: str) -> str:
        return os.path.join(self.output_dir, "cells", f"{cell_id}.json")

    def run_dir(self, cell_id: str) -> str:
        return os.path.join(self.output_dir, "runs", cell_id)

    # ---- states ---------------------------------------------------------------------------------------
    def states(self) -> List[CellState]:
        """Every planned cell with its status, from the records on disk and this build's methods: the sweep's
        cells first, then the main cells at the rates the finished sweep chose (``waiting`` where it has not)."""
        methods = available_methods()
        sweep = [self._state(cell, methods) for cell in self.sweep_cells]
        rates = chosen_rates(choose_rates(sweep, self.budget))
        main = plan(self.budget, self.tasks, self.methods, self.seeds, rates)
        return sweep + [self._state(cell, methods) for cell in main]

    def _state(self, cell: Cell, methods: frozenset) -> CellState:
        cell_id = cell.cell_id(self.settings)
        if cell.awaits_rate:
            return CellState(cell, cell_id, "unavailable" if cell.row.method not in methods else WAITING)
        record = read_json_object(self.record_path(cell_id))
        if record is not None and record.get("format") == RECORD_FORMAT and record.get("status") in ("done", "failed"):
            status = record["status"]
            if status == "failed" and self.retry_failed:
                status = "pending"
        elif cell.row.method not in methods:
            status, record = "unavailable", None
        else:
            status, record = "pending", None
        return CellState(cell, cell_id, status, record)

    # ---- running ---------------------------------------------------------------------------------------
    def command(self, cell: Cell, cell_id: str, recipes_dir: str) -> List[str]:
        return cell_runs.recipe_command(cell.spec.recipe, cell.recipe_args(self.settings), self.run_dir(cell_id),
                                        self.python, recipes_dir)

    def run(self, progress: bool = True, echo=print, max_cells: Optional[int] = None, jobs: int = 1) -> List[CellState]:
        """Run the pending cells in plan order (at most ``max_cells`` of them), ``jobs`` at a time (one GPU
        holds several small runs; on a CPU each run gets an equal share of the cores); then, when the sweep
        has chosen rates meanwhile, the main cells that were waiting for them. Returns the states."""
        if jobs < 1:
            raise StudyError(f"--jobs {jobs}: must be at least 1.")
        with _exclusive(self.output_dir):
            if self._environment is None:  # once, before any worker thread: every record says where it ran
                self._environment = environment()
            states = self.states()
            counts = {status: sum(s.status == status for s in states)
                      for status in ("pending", "done", "failed", "unavailable", WAITING)}
            echo(f"study {self.budget.name}: {len(states)} cells: {counts['done']} finished (skipped), {counts['failed']} "
                 f"failed before (skipped; --retry_failed runs them again), {counts['unavailable']} {NOT_AVAILABLE}, "
                 f"{counts['pending']} to run" + (f", {counts[WAITING]} {WAITING}" if counts[WAITING] else ""))
            left = max_cells
            attempted: set = set()
            while True:
                pending = [s for s in states if s.status == "pending" and s.cell_id not in attempted]
                if left is not None:
                    if not attempted:
                        echo(f"running {min(len(pending), max(0, left))} of them (--max_cells {max_cells})")
                    pending = pending[: max(0, left)]
                    left -= len(pending)
                if not pending:
                    return states
                self._run_round(pending, jobs, progress, echo)
                attempted.update(s.cell_id for s in pending)
                if not any(s.status == WAITING for s in states):
                    return states
                states = self.states()  # the finished sweep may have chosen rates: plan those main cells
                newly = sum(s.status == "pending" and s.cell_id not in attempted for s in states)
                if newly and left != 0:
                    echo(f"the sweep chose learning rates: {newly} more cell(s) to run")

    def _run_round(self, pending: List[CellState], jobs: int, progress: bool, echo) -> None:
        """The cells through :func:`~bitfit_hf.utils.cell_runs.run_cells`: each finished cell is reported as it
        ends; on Ctrl-C the running children are stopped (their cells stay pending) and the interrupt goes on."""
        recipes_dir = find_recipes_dir(self._recipes_dir)
        threads = _threads_per_job(jobs)
        bar = _progress_bar(pending, progress)
        count = 0

        def run(state: CellState, stop: Optional[threading.Event]) -> Dict[str, Any]:
            return self._run_cell(state.cell, state.cell_id, recipes_dir, threads, stop)

        def finished(state: CellState, record: Dict[str, Any]) -> None:
            nonlocal count
            count += 1
            state.record = record
            state.status = record["status"]
            line = _cell_line(count, len(pending), state)
            if bar is not None:
                bar.update(state.cell.estimated_seconds())
                bar.write(line)
            else:
                echo(line)

        def running(states: List[CellState]) -> None:
            if bar is not None:
                bar.set_postfix_str(f"cell {count + 1}/{len(pending)} {states[0].cell_id}" if jobs == 1 else
                                    ", ".join(s.cell_id for s in states), refresh=True)

        try:
            cell_runs.run_cells(pending, run, jobs=jobs, finished=finished, running=running)
        finally:
            if bar is not None:
                bar.close()

    def portable_command(self, cell: Cell, cell_id: str) -> List[str]:
        """The cell's command as a record keeps it: ``python recipes/<recipe>.py ... --output_dir runs/<id>``, with no
        path of this machine (the interpreter, the checkout, the study folder), so records travel with the study."""
        return ["python", f"recipes/{cell.spec.recipe}.py", *cell.recipe_args(self.settings),
                "--output_dir", os.path.relpath(self.run_dir(cell_id), self.output_dir)]

    def _run_cell(self, cell: Cell, cell_id: str, recipes_dir: str, threads: Optional[int] = None,
                  stop: Optional[threading.Event] = None) -> Dict[str, Any]:
        run_dir = self.run_dir(cell_id)
        shutil.rmtree(run_dir, ignore_errors=True)  # a half-finished run of a killed study
        os.makedirs(os.path.dirname(run_dir), exist_ok=True)
        log_path = run_dir + ".log"
        run = cell_runs.run_recipe_cell(
            cell.spec.recipe, cell.recipe_args(self.settings), run_dir, name=cell_id, python=self.python,
            recipes_dir=recipes_dir, threads=threads, env={"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"},
            log_path=log_path, stop=stop, check=False,
        )
        record: Dict[str, Any] = {
            "format": RECORD_FORMAT,
            "cell_id": cell_id,
            "task": cell.task,
            "method": cell.method,
            "recipe_method": cell.row.method,
            "train_size": cell.train_size,
            "seed": cell.seed,
            "epochs": cell.epochs,
            "learning_rate": cell.learning_rate,
            "stage": cell.stage,
            "purposes": list(cell.purposes),
            "command": self.portable_command(cell, cell_id),
            "wall_s": run.wall_s,
            "cpu_s": run.cpu_s,
            "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "environment": self._environment,
            "log": os.path.relpath(log_path, self.output_dir),
        }
        if not run.ok:
            record.update(status="failed", error=f"{run.how}: {_error_line(log_path)}")
        else:
            try:
                record.update(status="done", **read_outcome(cell, run_dir, run.peak_rss_mb))
            except ValueError as err:
                record.update(status="failed", error=str(err))
        if not self.keep_outputs:
            _prune(run_dir)
        write_json_atomic(self.record_path(cell_id), record)
        return record


def _threads_per_job(jobs: int) -> Optional[int]:
    """CPU threads for each of ``jobs`` concurrent runs (an equal share of this process's cores); ``None``
    for one job, or when the user set ``OMP_NUM_THREADS`` (theirs is kept)."""
    if jobs == 1 or os.environ.get("OMP_NUM_THREADS"):
        return None
    return cell_runs.cores_per_job(jobs)


def _progress_bar(pending: List[CellState], enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    total = sum(s.cell.estimated_seconds() for s in pending)
    # The bar advances by each cell's estimated cost, so the ETA scales the estimate by the measured speed.
    return tqdm(total=total, unit="", desc="study", dynamic_ncols=True, file=sys.stderr,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}] {postfix}")


def _cell_line(index: int, total: int, state: CellState) -> str:
    record = state.record or {}
    if state.status == "done":
        score = f"{record['metric']} {record['score']:.2f}"
        if record.get("train_score") is not None:
            score += f" (train {record['train_score']:.2f})"
        return f"[{index}/{total}] {state.cell_id}: {score}, {record['wall_s']:.0f} s"
    return f"[{index}/{total}] {state.cell_id}: FAILED ({record.get('error', '?')})"
