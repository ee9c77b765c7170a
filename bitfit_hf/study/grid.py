"""Which cells the study runs: :func:`plan` expands a budget (:mod:`bitfit_hf.study.budgets`) into
:class:`Cell` objects, each one real recipe run identified by a hash of its exact command line, so a stored
result is reused only for the identical run.

The sweep (:func:`sweep_plan`) runs first: each swept row at a few learning rates, scored on a dev
split carved from the training data (``--dev_split_from_train``), as the paper chose its rates per task.
The main cells of a swept row take the rate it chose (:mod:`bitfit_hf.study.sweep`), so they can only be
planned with their exact command once the sweep's cells are finished.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from bitfit_hf.study.budgets import METHOD_ROWS, TASKS, Budget, MethodRow, TaskBudget, TaskSpec

__all__ = [
    "StudySettings",
    "Cell",
    "SWEEP",
    "MAIN",
    "plan",
    "sweep_plan",
    "swept_rows",
    "epochs_for",
]


@dataclass(frozen=True)
class StudySettings:
    """Options that apply to every cell (and so enter every cell's identity). ``lr_scheduler_type``:
    ``constant`` trains at one rate throughout, as the official BitFit code; ``None`` keeps the recipes'
    default (a linear decay to zero)."""

    model_name_or_path: Optional[str] = None
    device: str = "auto"  # auto | cpu | cuda
    recipe_args: Tuple[str, ...] = ()
    lr_scheduler_type: Optional[str] = None


def epochs_for(train_size: int, batch_size: int, epochs: float, min_steps: int) -> float:
    """``epochs``, raised so that training takes at least ``min_steps`` optimizer steps."""
    steps_per_epoch = max(1, math.ceil(train_size / batch_size))
    needed = math.ceil(min_steps / steps_per_epoch)
    return float(max(epochs, needed))


SWEEP = "sweep"
MAIN = "main"


@dataclass(frozen=True)
class Cell:
    """One training run: a method row on a task at a training-set size and seed.

    ``stage`` is ``sweep`` for a learning-rate sweep run (evaluated on the dev split of ``dev_samples``
    training examples, no training-set score) or ``main``. ``learning_rate`` ``None``: the recipe's default
    rate. ``awaits_rate``: a main cell of a swept row whose sweep has not chosen yet (never run as is)."""

    task: str
    method: str
    train_size: int
    seed: int
    epochs: float
    eval_samples: int
    train_score_samples: int
    epoch_eval: bool
    flags: Tuple[str, ...] = ()
    purposes: Tuple[str, ...] = field(default=(), compare=False)
    learning_rate: Optional[float] = None
    stage: str = MAIN
    dev_samples: Optional[int] = None
    awaits_rate: bool = False

    @property
    def row(self) -> MethodRow:
        return METHOD_ROWS[self.method]

    @property
    def spec(self) -> TaskSpec:
        return TASKS[self.task]

    def recipe_args(self, settings: StudySettings) -> List[str]:
        """The recipe's command line for this cell, without ``--output_dir``."""
        task, row = self.spec, self.row
        argv: List[str] = [*task.data_flags, "--method", row.method, *row.flags, *row.head_flags]
        if settings.model_name_or_path:
            argv += ["--model_name_or_path", settings.model_name_or_path]
        if self.stage == SWEEP:
            argv += ["--do_train", "--do_eval", "--dev_split_from_train", str(self.dev_samples),
                     "--max_train_samples", str(self.train_size), "--max_eval_samples", str(self.dev_samples)]
        else:  # (the order of these flags is part of every stored cell's identity: keep it)
            argv += [
                "--do_train", "--do_eval", "--do_predict",
                "--max_train_samples", str(self.train_size),
                "--max_eval_samples", str(self.eval_samples),
                # the training-set score: --do_predict on the first N training examples
                "--predict_split", "train",
                "--max_predict_samples", str(min(self.train_score_samples, self.train_size)),
            ]
        argv += [
            "--num_train_epochs", _number(self.epochs),
            "--per_device_train_batch_size", str(task.train_batch_size),
            "--seed", str(self.seed),
            "--eval_strategy", "epoch" if self.epoch_eval else "no",
            "--save_strategy", "no",
            "--eval_before_training", "False",
            "--logging_steps", "5",
            "--report_to", "none",
            "--disable_tqdm", "True",
        ]
        if self.learning_rate is not None:
            argv += ["--learning_rate", f"{self.learning_rate:g}"]
        if settings.lr_scheduler_type:
            argv += ["--lr_scheduler_type", settings.lr_scheduler_type]
        if settings.device == "cpu":
            argv += ["--use_cpu", "True"]
        elif settings.device == "cuda":
            argv += ["--use_cpu", "False", "--skip_memory_metrics", "False"]
        argv += list(self.flags) + list(settings.recipe_args)
        return argv

    def key(self, settings: StudySettings) -> str:
        """A short hash of the exact run (recipe and arguments): a stored result is reused only for it.

        ``--probe_head_start false`` is left out of the hash: it names how every cell recorded before the switch
        existed ran (a randomly initialised head), so those records keep their identity."""
        argv = self.recipe_args(settings)
        at = next((i for i in range(len(argv) - 1) if argv[i:i + 2] == ["--probe_head_start", "false"]), None)
        if at is not None:
            argv = argv[:at] + argv[at + 2:]
        text = "\0".join([self.spec.recipe, *argv])
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]

    def cell_id(self, settings: StudySettings) -> str:
        rate = "" if self.learning_rate is None else f"-lr{self.learning_rate:g}"
        if self.stage == SWEEP:
            return f"sweep-{self.task}-{self.method}-n{self.train_size}{rate}-s{self.seed}-{self.key(settings)}"
        if self.awaits_rate:
            return f"{self.task}-{self.method}-n{self.train_size}-s{self.seed}-lr?"
        return f"{self.task}-{self.method}-n{self.train_size}-s{self.seed}{rate}-{self.key(settings)}"

    def estimated_seconds(self) -> float:
        """Rough cost on an idle 2-core CPU with MiniLM (progress bar and dry-run estimate only)."""
        task = self.spec
        train = self.train_size * self.epochs * task.seconds_per_train_example * self.row.cost_factor
        evals = 1 + (math.ceil(self.epochs) if self.epoch_eval else 0)
        if self.stage == SWEEP:
            return task.load_seconds + train + evals * (self.dev_samples or 0) * task.seconds_per_eval_example
        scored = self.eval_samples if self.eval_samples > 0 else 1000
        evaluation = (evals * scored + min(self.train_score_samples, self.train_size)) * task.seconds_per_eval_example
        return task.load_seconds + train + evaluation


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _check_names(tasks: Optional[Sequence[str]], methods: Optional[Sequence[str]]) -> None:
    unknown = [t for t in (tasks or ()) if t not in TASKS] + [m for m in (methods or ()) if m not in METHOD_ROWS]
    if unknown:
        raise ValueError(
            f"unknown task or method row: {', '.join(unknown)} (tasks: {', '.join(TASKS)}; rows: {', '.join(METHOD_ROWS)})"
        )


def swept_rows(budget: Budget, task: str) -> Tuple[str, ...]:
    """The rows of ``task`` the sweep tunes: its judged rows whose recipe method has rates to try (a probe row
    has none: its head is fitted to convergence, not trained at a rate)."""
    share = budget.tasks.get(task)
    if budget.sweep is None or share is None:
        return ()
    return tuple(m for m in share.methods
                 if not METHOD_ROWS[m].probe and budget.sweep.rates_for(METHOD_ROWS[m].method))


def sweep_plan(
    budget: Budget,
    tasks: Optional[Sequence[str]] = None,
    methods: Optional[Sequence[str]] = None,
) -> List[Cell]:
    """The sweep's cells: each swept row of each task at every rate and sweep seed, at the task's main
    training size, evaluated on its dev split (``--seeds`` does not filter them: they choose the rates)."""
    _check_names(tasks, methods)
    if budget.sweep is None:
        return []
    cells = []
    for task, share in budget.tasks.items():
        if tasks and task not in tasks:
            continue
        spec = TASKS[task]
        epochs = epochs_for(share.train_size, spec.train_batch_size, share.epochs, budget.min_steps)
        for method in swept_rows(budget, task):
            if methods and method not in methods:
                continue
            for rate in budget.sweep.rates_for(METHOD_ROWS[method].method):
                for seed in budget.sweep.seeds:
                    cells.append(Cell(
                        task=task, method=method, train_size=share.train_size, seed=seed, epochs=epochs,
                        eval_samples=share.dev_samples, train_score_samples=0, epoch_eval=False,
                        flags=share.extra_flags, purposes=(SWEEP,), learning_rate=rate, stage=SWEEP,
                        dev_samples=share.dev_samples,
                    ))
    return cells


def plan(
    budget: Budget,
    tasks: Optional[Sequence[str]] = None,
    methods: Optional[Sequence[str]] = None,
    seeds: Optional[Sequence[int]] = None,
    rates: Optional[Mapping[Tuple[str, str], float]] = None,
) -> List[Cell]:
    """Every main cell of ``budget`` (optionally only some tasks / method rows / seeds), each run once even
    when the main grid and the curve both need it (its ``purposes`` then name both). ``rates``: the
    learning rate the sweep chose per (task, row); a swept row without one gives cells that await it."""
    _check_names(tasks, methods)
    rates = rates or {}

    def wanted(task: str, method: str) -> bool:
        return (not tasks or task in tasks) and (not methods or method in methods)

    cells: Dict[Tuple, Cell] = {}

    def add(task: str, method: str, size: int, seed: int, first_seed: int, share: TaskBudget, purpose: str) -> None:
        if not wanted(task, method) or (seeds and seed not in seeds):
            return
        spec = TASKS[task]
        epoch_eval = budget.epoch_eval == "all" or (budget.epoch_eval == "first_seed" and seed == first_seed)
        swept = method in swept_rows(budget, task)
        cell = Cell(
            task=task, method=method, train_size=size, seed=seed,
            epochs=epochs_for(size, spec.train_batch_size, share.epochs, budget.min_steps),
            eval_samples=share.eval_samples, train_score_samples=share.train_score_samples,
            epoch_eval=epoch_eval, flags=share.extra_flags, purposes=(purpose,),
            learning_rate=rates.get((task, method)) if swept else None,
            awaits_rate=swept and (task, method) not in rates,
        )
        identity = (cell.task, cell.method, cell.train_size, cell.seed, cell.epochs, cell.eval_samples,
                    cell.train_score_samples, cell.epoch_eval, cell.flags, cell.learning_rate)
        if identity in cells:
            previous = cells[identity]
            merged = tuple(dict.fromkeys(previous.purposes + (purpose,)))
            cells[identity] = Cell(**{**previous.__dict__, "purposes": merged})
        else:
            cells[identity] = cell

    for task, share in budget.tasks.items():
        first = share.seeds[0]
        for method in share.methods:
            for seed in share.seeds:
                add(task, method, share.train_size, seed, first, share, "grid")
        for method in share.single_seed_methods:
            add(task, method, share.train_size, first, first, share, "grid")
    if budget.curve is not None and budget.curve.task in budget.tasks:
        share = budget.tasks[budget.curve.task]
        first = share.seeds[0]
        for size, seeds_at in budget.curve.sizes:
            for method in budget.curve.methods:
                for seed in seeds_at:
                    add(budget.curve.task, method, size, seed, first, share, "curve")
    return list(cells.values())
