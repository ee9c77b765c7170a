"""What the study runs: tasks, method rows, budgets, and the cells they expand to.

A *method row* names a recipe ``--method`` plus flags (``--bias_terms b_q b_m2``); a *task* names a
recipe and its data; a *budget* says, per task, which rows run, on how many training examples, for
how many epochs and with which seeds, plus the training-size curve and the learning-rate sweep.
:func:`plan` expands a budget into :class:`Cell` objects, each one real recipe run identified by a hash
of its exact command line, so a stored result is reused only for the identical run.

The sweep (:func:`sweep_plan`) runs first: each swept row at a few learning rates, scored on a dev
split carved from the training data (``--dev_split_from_train``), as the paper chose its rates per task.
The main cells of a swept row take the rate it chose (:mod:`bitfit_hf.study.sweep`), so they can only be
planned with their exact command once the sweep's cells are finished.

Rows whose ``--method`` this build's recipes do not know (methods still being merged) stay in the
grid: their cells are planned and reported as "not run: method not available in this build".
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "TaskSpec",
    "MethodRow",
    "TaskBudget",
    "CurveBudget",
    "SweepBudget",
    "CpuSizing",
    "cpu_budget",
    "Budget",
    "StudySettings",
    "Cell",
    "TASKS",
    "METHOD_ROWS",
    "BUDGETS",
    "plan",
    "sweep_plan",
    "swept_rows",
    "epochs_for",
]


@dataclass(frozen=True)
class TaskSpec:
    """One task of the study and how its recipe is called.

    ``metric`` is the key the recipe reports after ``eval_`` / ``predict_``; ``scale`` turns it into
    points (accuracy 0-1 -> 0-100; SQuAD F1 is already 0-100). ``seconds_per_train_example`` and
    ``seconds_per_eval_example`` are rough costs on an idle 2-core CPU with all-MiniLM-L6-v2, used only
    for the progress bar and the dry-run estimate (derived from the recipes' measured default runs).
    """

    name: str
    title: str
    recipe: str
    data_flags: Tuple[str, ...]
    metric: str
    metric_label: str
    scale: float
    train_batch_size: int
    seconds_per_train_example: float
    seconds_per_eval_example: float
    load_seconds: float = 10.0
    dataset: str = ""  # the offline dataset the recipe reads (its constant predictor is scored on it)


@dataclass(frozen=True)
class MethodRow:
    """A row of the method grid: the recipe ``--method`` and the flags that make this variant."""

    name: str
    label: str
    method: str
    flags: Tuple[str, ...] = ()
    cost_factor: float = 1.0  # training cost relative to BitFit (full fine-tuning updates every weight)


TASKS: Dict[str, TaskSpec] = {
    task.name: task
    for task in (
        # Batch 8 everywhere, as the official BitFit code: small training sets then still give the optimizer
        # enough steps (400 sentences at batch 32 x 4 epochs = 52 steps left MiniLM at chance in a trial run).
        # README: 3,200 sentences x 3 epochs trained in 187 s -> ~0.02 s per sentence pass (batch 32; a
        # smaller batch costs a little more per example).
        TaskSpec("sentiment", "movie-review sentiment (SST-2-style sentences)", "glue", (), "accuracy",
                 "accuracy", 100.0, 8, 0.024, 0.007, dataset="movie_reviews"),
        # evidence + claim is about twice a movie-review sentence in tokens.
        TaskSpec("pair", "VitaminC fact verification (evidence/claim pairs, 3 classes)", "glue",
                 ("--dataset_name", "vitaminc"), "accuracy", "accuracy", 100.0, 8, 0.050, 0.015, 14.0,
                 dataset="vitaminc"),
        # README: 801 lines x 3 epochs in 59 s (batch 8).
        TaskSpec("pos", "WSJ part-of-speech tagging (Penn Treebank tags)", "pos", (), "accuracy",
                 "token accuracy", 100.0, 8, 0.025, 0.008, dataset="wsj_pos"),
        # README: 1,000 questions x 2 epochs (256-token windows, batch 16) in 332 s.
        TaskSpec("qa", "extractive QA, SQuAD v1.1 format (dev-set articles)", "squad", (), "f1", "F1", 1.0,
                 8, 0.180, 0.055, 12.0, dataset="squad_dev"),
    )
}

METHOD_ROWS: Dict[str, MethodRow] = {
    row.name: row
    for row in (
        MethodRow("bitfit", "BitFit (all biases)", "bitfit"),
        MethodRow("paper_subset", "BitFit b_q + b_m2", "bitfit", ("--bias_terms", "paper-subset")),
        MethodRow("b_q", "BitFit b_q only", "bitfit", ("--bias_terms", "b_q")),
        MethodRow("b_m2", "BitFit b_m2 only", "bitfit", ("--bias_terms", "b_m2")),
        MethodRow("frozen", "frozen (head only)", "frozen"),
        MethodRow("full", "full fine-tuning", "full", cost_factor=1.4),
        MethodRow("rand_uniform", "random scalars (rand uniform)", "rand_uniform"),
        MethodRow("rand_row_col", "random rows/cols (rand row/col)", "rand_row_col"),
        MethodRow("lora", "LoRA", "lora", cost_factor=1.1),
        MethodRow("bitfit_lora", "BitFit + LoRA", "bitfit_lora", cost_factor=1.1),
        MethodRow("adapterbias", "AdapterBias", "adapterbias"),
        MethodRow("ia3", "(IA)³", "ia3", cost_factor=1.1),
        MethodRow("bitfit_ia3", "BitFit + (IA)³", "bitfit_ia3", cost_factor=1.1),
    )
}

#: Rows that answer the paper's claims (run with every seed); the others fill the cost table.
CLAIM_ROWS = ("bitfit", "paper_subset", "b_q", "b_m2", "frozen", "full", "rand_uniform", "rand_row_col")
COST_ROWS = ("lora", "bitfit_lora", "adapterbias", "ia3", "bitfit_ia3")


@dataclass(frozen=True)
class TaskBudget:
    """One task's share of a budget.

    ``methods`` run with every seed; ``single_seed_methods`` with the first seed only (nothing is
    judged on them). ``train_score_samples``: how many of the training examples are scored after
    training (the generalisation gap). ``dev_samples``: the sweep's dev split, the last training
    examples (its runs train on the first ``train_size`` of the rest, the main runs' first examples).
    """

    train_size: int
    seeds: Tuple[int, ...]
    methods: Tuple[str, ...]
    single_seed_methods: Tuple[str, ...] = ()
    epochs: float = 3.0
    eval_samples: int = 500
    train_score_samples: int = 500
    extra_flags: Tuple[str, ...] = ()
    dev_samples: int = 200


@dataclass(frozen=True)
class CurveBudget:
    """The training-size curve: BitFit and full fine-tuning on ``task`` at growing sizes (the paper's
    Figure 2 is SQuAD). ``sizes`` pairs each training-set size with the seeds run at it (large sizes
    cost most); the task's other settings (epochs, evaluation samples, learning rates) are its budget's."""

    task: str
    sizes: Tuple[Tuple[int, Tuple[int, ...]], ...]
    methods: Tuple[str, ...] = ("bitfit", "full")


@dataclass(frozen=True)
class SweepBudget:
    """The per-task learning-rate sweep: every judged row (a task's ``methods``) whose recipe method has a
    default rate runs at each rate of ``factors`` x that default (``DEFAULT_LEARNING_RATES`` of the
    recipes, or ``rates`` where given) with ``seeds``, scored on the task's dev split."""

    factors: Tuple[float, ...] = (1.0, 3.0, 10.0)
    seeds: Tuple[int, ...] = (1,)
    rates: Tuple[Tuple[str, Tuple[float, ...]], ...] = ()  # (recipe method, rates): instead of the factors

    def rates_for(self, method: str) -> Tuple[float, ...]:
        """The rates tried for recipe ``method`` (empty: the method is not swept)."""
        explicit = dict(self.rates)
        if method in explicit:
            return tuple(explicit[method])
        from bitfit_hf.recipe_kit.args import DEFAULT_LEARNING_RATES

        default = DEFAULT_LEARNING_RATES.get(method)
        if default is None:
            return ()
        return tuple(sorted({float(f"{default * factor:.3g}") for factor in self.factors}))


@dataclass(frozen=True)
class Budget:
    """A named grid. ``min_steps``: small training sets get more epochs so every run takes at least
    this many optimizer steps (3 epochs of 100 examples would be 10 steps). ``epoch_eval``: which
    runs evaluate after every epoch (to count epochs to converge): ``first_seed`` or ``all``.
    ``sweep``: the learning-rate sweep (``None``: every row trains at its recipe's default rate)."""

    name: str
    description: str
    tasks: Dict[str, TaskBudget]
    curve: Optional[CurveBudget]
    min_steps: int = 40
    epoch_eval: str = "first_seed"
    hardware: str = "a 2-core CPU"
    sweep: Optional[SweepBudget] = None


_SEEDS3 = (1, 2, 3)


def _per_task(**values):
    return tuple(sorted(values.items()))


@dataclass(frozen=True)
class CpuSizing:
    """The sizes of the CPU default budget, apart from its shape (which tasks, rows and curve run).

    Per-task fields are ``(task, value)`` pairs, kept for every task so that ``tasks`` can name any of them.
    The budget is sized so that every judged cell passes the validity gate within about 90 minutes on 2
    cores, by measuring a few cells and changing these numbers (never the rules): the pair and QA tasks are
    left out because BitFit's sweep cells at these sizes did not leave the constant predictor (the
    figures are in docs/study.md, "Sizing the CPU budget"), so no claim could be judged on them here; they
    run in the GPU budget, as does the SQuAD curve (``curve_sizes`` empty: no curve)."""

    tasks: Tuple[str, ...] = ("sentiment", "pos")
    train_size: Tuple[Tuple[str, int], ...] = _per_task(sentiment=400, pair=400, pos=400, qa=200)
    seeds: Tuple[Tuple[str, Tuple[int, ...]], ...] = _per_task(sentiment=_SEEDS3, pair=_SEEDS3, pos=_SEEDS3, qa=(1, 2))
    epochs: Tuple[Tuple[str, float], ...] = _per_task(sentiment=3.0, pair=3.0, pos=3.0, qa=2.0)
    eval_samples: Tuple[Tuple[str, int], ...] = _per_task(sentiment=400, pair=400, pos=100, qa=150)
    train_score_samples: Tuple[Tuple[str, int], ...] = _per_task(sentiment=400, pair=400, pos=200, qa=150)
    dev_samples: Tuple[Tuple[str, int], ...] = _per_task(sentiment=400, pair=400, pos=100, qa=150)
    min_steps: int = 30
    #: The SQuAD curve (the paper's Figure 2): (training questions, seeds) per point.
    curve_sizes: Tuple[Tuple[int, Tuple[int, ...]], ...] = ()
    #: Rates tried per row: these multiples of the recipe's default. Upwards from the default because at a
    #: few hundred steps the recipes' sweep (benchmarks/lr_sweep.py) found BitFit's, LoRA's and AdapterBias's
    #: best at 3-10x it; a choice on the grid's edge is flagged in the report.
    sweep_factors: Tuple[float, ...] = (1.0, 3.0, 10.0)
    sweep_seeds: Tuple[int, ...] = (1,)
    sweep: bool = True


def cpu_budget(sizing: CpuSizing = CpuSizing(), name: str = "default") -> Budget:
    """The CPU default's shape (every claim row on sentiment, BitFit and full fine-tuning on each other task of
    ``sizing.tasks``, the cost rows once, the SQuAD curve when sized, a sweep per task and row) at the sizes of
    ``sizing``."""
    value = {field: dict(getattr(sizing, field)) for field in
             ("train_size", "seeds", "epochs", "eval_samples", "train_score_samples", "dev_samples")}
    rows = {"sentiment": (CLAIM_ROWS, COST_ROWS), "pair": (("bitfit", "full"), ()), "pos": (("bitfit", "full"), ()),
            "qa": (("bitfit", "full"), ())}
    tasks = {
        task: TaskBudget(value["train_size"][task], tuple(value["seeds"][task]), methods, single,
                         epochs=value["epochs"][task], eval_samples=value["eval_samples"][task],
                         train_score_samples=value["train_score_samples"][task],
                         dev_samples=value["dev_samples"][task])
        for task, (methods, single) in rows.items() if task in sizing.tasks
    }
    unknown = [task for task in sizing.tasks if task not in rows]
    if unknown:
        raise ValueError(f"CpuSizing.tasks names {unknown}; the CPU budget's tasks are {', '.join(rows)}")
    if sizing.curve_sizes and "qa" not in tasks:
        raise ValueError("CpuSizing.curve_sizes is a SQuAD curve: add 'qa' to CpuSizing.tasks, or leave the curve empty")
    return Budget(
        name=name,
        description="every claim the data allows on a 2-core CPU with all-MiniLM-L6-v2: small training sets of the "
        "tasks it learns at that size (" + ", ".join(tasks) + "), a learning-rate sweep per task and row on a dev "
        "split, 2-3 seeds for the judged comparisons" + (", the SQuAD training-size curve" if sizing.curve_sizes
                                                         else "; the SQuAD curve is the GPU budget's"),
        tasks=tasks,
        curve=CurveBudget("qa", tuple(sizing.curve_sizes)) if sizing.curve_sizes else None,
        min_steps=sizing.min_steps,
        epoch_eval="first_seed",
        sweep=SweepBudget(tuple(sizing.sweep_factors), tuple(sizing.sweep_seeds)) if sizing.sweep else None,
    )


BUDGETS: Dict[str, Budget] = {
    "default": cpu_budget(),
    "full": Budget(
        name="full",
        description="the whole grid for a GPU (pass --device cuda and a base-size --model_name_or_path): "
        "larger training sets, a learning-rate sweep per task and row, 5 seeds, every method on every task, the "
        "curve on QA as in the paper",
        tasks={
            "sentiment": TaskBudget(4000, (1, 2, 3, 4, 5), CLAIM_ROWS + COST_ROWS, eval_samples=1000,
                                    train_score_samples=1000, dev_samples=1000),
            "pair": TaskBudget(8000, (1, 2, 3, 4, 5), CLAIM_ROWS + COST_ROWS, eval_samples=2000,
                               train_score_samples=1000, dev_samples=1000),
            "pos": TaskBudget(801, (1, 2, 3, 4, 5), CLAIM_ROWS + COST_ROWS, eval_samples=-1,
                              train_score_samples=400, dev_samples=100),
            "qa": TaskBudget(4000, (1, 2, 3), CLAIM_ROWS + COST_ROWS, epochs=2.0, eval_samples=1000,
                             train_score_samples=500, dev_samples=500),
        },
        curve=CurveBudget("qa", ((250, (1, 2, 3)), (500, (1, 2, 3)), (1000, (1, 2, 3)), (2000, (1, 2, 3)),
                                 (4000, (1, 2, 3)), (8000, (1, 2, 3)))),
        min_steps=100,
        epoch_eval="all",
        hardware="one GPU",
        sweep=SweepBudget(factors=(0.3, 1.0, 3.0, 10.0), seeds=(1,)),
    ),
    "gpu": Budget(
        name="gpu",
        description="the paper's tasks on one GPU in about 14 minutes on an H200 (pass --device cuda, "
        "--model_name_or_path mpnet, --jobs 14 and --recipe_args '--tf32 True'): every claim row on sentiment, BitFit and full fine-tuning "
        "on the pair, POS and QA tasks, 3 seeds, the SQuAD curve at 250 / 1,000 / 4,000 questions, the sweep (3 "
        "rates); a subset of `full`",
        tasks={
            # Sized for one session's GPU time (a 10-minute call, the weights shipped beforehand): about 42,000
            # optimizer steps and 101 process starts over 14 concurrent runs (docs/study.md has the measured time).
            "sentiment": TaskBudget(1000, _SEEDS3, CLAIM_ROWS, COST_ROWS, eval_samples=1000, train_score_samples=500,
                                    dev_samples=500),
            "pair": TaskBudget(2000, _SEEDS3, ("bitfit", "full"), eval_samples=1000, train_score_samples=500,
                               dev_samples=500),
            "pos": TaskBudget(801, _SEEDS3, ("bitfit", "full"), eval_samples=-1, train_score_samples=400,
                              dev_samples=100),
            "qa": TaskBudget(1000, _SEEDS3, ("bitfit", "full"), epochs=2.0, eval_samples=500, train_score_samples=300,
                             dev_samples=300),
        },
        curve=CurveBudget("qa", ((250, _SEEDS3), (1000, _SEEDS3), (4000, _SEEDS3))),
        min_steps=100,
        epoch_eval="first_seed",
        hardware="one GPU",
        sweep=SweepBudget(factors=(1.0, 3.0, 10.0), seeds=(1,)),
    ),
    "smoke": Budget(
        name="smoke",
        description="a few tiny runs per task to check the machinery end to end (minutes); judges nothing "
        "meaningfully",
        tasks={
            "sentiment": TaskBudget(16, (1, 2), ("bitfit", "paper_subset", "full"), ("lora",), epochs=1.0,
                                    eval_samples=16, train_score_samples=8),
            "pair": TaskBudget(16, (1,), ("bitfit",), epochs=1.0, eval_samples=16, train_score_samples=8),
            "pos": TaskBudget(16, (1,), ("bitfit", "full"), epochs=1.0, eval_samples=8, train_score_samples=8),
            "qa": TaskBudget(8, (1,), ("bitfit",), epochs=1.0, eval_samples=8, train_score_samples=4),
        },
        curve=CurveBudget("sentiment", ((8, (1,)), (16, (1,)))),
        min_steps=1,
        epoch_eval="first_seed",
    ),
}


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
        argv: List[str] = [*task.data_flags, "--method", row.method, *row.flags]
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
        """A short hash of the exact run (recipe and arguments): a stored result is reused only for it."""
        text = "\0".join([self.spec.recipe, *self.recipe_args(settings)])
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
    """The rows of ``task`` the sweep tunes: its judged rows whose recipe method has rates to try."""
    share = budget.tasks.get(task)
    if budget.sweep is None or share is None:
        return ()
    return tuple(m for m in share.methods if budget.sweep.rates_for(METHOD_ROWS[m].method))


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
