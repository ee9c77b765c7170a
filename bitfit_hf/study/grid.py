"""What the study runs: tasks, method rows, budgets, and the cells they expand to.

A *method row* names a recipe ``--method`` plus flags (``--bias_terms b_q b_m2``); a *task* names a
recipe and its data; a *budget* says, per task, which rows run, on how many training examples, for
how many epochs and with which seeds, plus the training-size curve. :func:`plan` expands a budget
into :class:`Cell` objects, each one real recipe run identified by a hash of its exact command line,
so a stored result is reused only for the identical run.

Rows whose ``--method`` this build's recipes do not know (methods still being merged) stay in the
grid: their cells are planned and reported as "not run: method not available in this build".
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = [
    "TaskSpec",
    "MethodRow",
    "TaskBudget",
    "CurveBudget",
    "Budget",
    "StudySettings",
    "Cell",
    "TASKS",
    "METHOD_ROWS",
    "BUDGETS",
    "plan",
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
                 "accuracy", 100.0, 8, 0.024, 0.007),
        # evidence + claim is about twice a movie-review sentence in tokens.
        TaskSpec("pair", "VitaminC fact verification (evidence/claim pairs, 3 classes)", "glue",
                 ("--dataset_name", "vitaminc"), "accuracy", "accuracy", 100.0, 8, 0.050, 0.015, 14.0),
        # README: 801 lines x 3 epochs in 59 s (batch 8).
        TaskSpec("pos", "WSJ part-of-speech tagging (Penn Treebank tags)", "pos", (), "accuracy",
                 "token accuracy", 100.0, 8, 0.025, 0.008),
        # README: 1,000 questions x 2 epochs (256-token windows, batch 16) in 332 s.
        TaskSpec("qa", "extractive QA, SQuAD v1.1 format (dev-set articles)", "squad", (), "f1", "F1", 1.0,
                 8, 0.180, 0.055, 12.0),
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
    )
}

#: Rows that answer the paper's claims (run with every seed); the others fill the cost table.
CLAIM_ROWS = ("bitfit", "paper_subset", "b_q", "b_m2", "frozen", "full", "rand_uniform", "rand_row_col")
COST_ROWS = ("lora", "bitfit_lora", "adapterbias")


@dataclass(frozen=True)
class TaskBudget:
    """One task's share of a budget.

    ``methods`` run with every seed; ``single_seed_methods`` with the first seed only (nothing is
    judged on them). ``train_score_samples``: how many of the training examples are scored after
    training (the generalisation gap).
    """

    train_size: int
    seeds: Tuple[int, ...]
    methods: Tuple[str, ...]
    single_seed_methods: Tuple[str, ...] = ()
    epochs: float = 3.0
    eval_samples: int = 500
    train_score_samples: int = 500
    extra_flags: Tuple[str, ...] = ()


@dataclass(frozen=True)
class CurveBudget:
    """The training-size curve: BitFit and full fine-tuning on ``task`` at growing sizes.

    ``sizes`` pairs each training-set size with the seeds run at it (large sizes cost most).
    """

    task: str
    sizes: Tuple[Tuple[int, Tuple[int, ...]], ...]
    methods: Tuple[str, ...] = ("bitfit", "full")


@dataclass(frozen=True)
class Budget:
    """A named grid. ``min_steps``: small training sets get more epochs so every run takes at least
    this many optimizer steps (3 epochs of 100 examples would be 10 steps). ``epoch_eval``: which
    runs evaluate after every epoch (to count epochs to converge): ``first_seed`` or ``all``."""

    name: str
    description: str
    tasks: Dict[str, TaskBudget]
    curve: Optional[CurveBudget]
    min_steps: int = 40
    epoch_eval: str = "first_seed"
    hardware: str = "a 2-core CPU"


_SEEDS3 = (1, 2, 3)

BUDGETS: Dict[str, Budget] = {
    "default": Budget(
        name="default",
        description="every claim the data allows, sized to finish within an hour on an idle 2-core CPU with "
        "all-MiniLM-L6-v2: small training sets, 3 seeds for the judged comparisons",
        tasks={
            "sentiment": TaskBudget(400, _SEEDS3, CLAIM_ROWS, COST_ROWS, eval_samples=400, train_score_samples=400),
            "pair": TaskBudget(400, _SEEDS3, ("bitfit", "full"), eval_samples=400, train_score_samples=400),
            "pos": TaskBudget(400, _SEEDS3, ("bitfit", "full"), eval_samples=100, train_score_samples=200),
            "qa": TaskBudget(200, (1, 2), ("bitfit", "full"), epochs=2.0, eval_samples=150,
                             train_score_samples=150),
        },
        curve=CurveBudget("sentiment", ((100, _SEEDS3), (400, _SEEDS3), (1600, (1, 2)))),
        min_steps=30,
        epoch_eval="first_seed",
    ),
    "full": Budget(
        name="full",
        description="the whole grid for a GPU (pass --device cuda and a base-size --model_name_or_path): "
        "larger training sets, 5 seeds, every method on every task, the curve on QA as in the paper",
        tasks={
            "sentiment": TaskBudget(4000, (1, 2, 3, 4, 5), CLAIM_ROWS + COST_ROWS, eval_samples=1000,
                                    train_score_samples=1000),
            "pair": TaskBudget(8000, (1, 2, 3, 4, 5), CLAIM_ROWS + COST_ROWS, eval_samples=2000,
                               train_score_samples=1000),
            "pos": TaskBudget(801, (1, 2, 3, 4, 5), CLAIM_ROWS + COST_ROWS, eval_samples=-1,
                              train_score_samples=400),
            "qa": TaskBudget(4000, (1, 2, 3), CLAIM_ROWS + COST_ROWS, epochs=2.0, eval_samples=1000,
                             train_score_samples=500),
        },
        curve=CurveBudget("qa", ((250, (1, 2, 3)), (500, (1, 2, 3)), (1000, (1, 2, 3)), (2000, (1, 2, 3)),
                                 (4000, (1, 2, 3)), (8000, (1, 2, 3)))),
        min_steps=100,
        epoch_eval="all",
        hardware="one GPU",
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
    """Options that apply to every cell (and so enter every cell's identity)."""

    model_name_or_path: Optional[str] = None
    device: str = "auto"  # auto | cpu | cuda
    recipe_args: Tuple[str, ...] = ()


def epochs_for(train_size: int, batch_size: int, epochs: float, min_steps: int) -> float:
    """``epochs``, raised so that training takes at least ``min_steps`` optimizer steps."""
    steps_per_epoch = max(1, math.ceil(train_size / batch_size))
    needed = math.ceil(min_steps / steps_per_epoch)
    return float(max(epochs, needed))


@dataclass(frozen=True)
class Cell:
    """One training run: a method row on a task at a training-set size and seed."""

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
        argv += [
            "--do_train", "--do_eval", "--do_predict",
            "--max_train_samples", str(self.train_size),
            "--max_eval_samples", str(self.eval_samples),
            # the training-set score: --do_predict on the first N training examples
            "--predict_split", "train",
            "--max_predict_samples", str(min(self.train_score_samples, self.train_size)),
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
        return f"{self.task}-{self.method}-n{self.train_size}-s{self.seed}-{self.key(settings)}"

    def estimated_seconds(self) -> float:
        """Rough cost on an idle 2-core CPU with MiniLM (progress bar and dry-run estimate only)."""
        task = self.spec
        train = self.train_size * self.epochs * task.seconds_per_train_example * self.row.cost_factor
        evals = 1 + (math.ceil(self.epochs) if self.epoch_eval else 0)
        scored = self.eval_samples if self.eval_samples > 0 else 1000
        evaluation = (evals * scored + min(self.train_score_samples, self.train_size)) * task.seconds_per_eval_example
        return task.load_seconds + train + evaluation


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def plan(
    budget: Budget,
    tasks: Optional[Sequence[str]] = None,
    methods: Optional[Sequence[str]] = None,
    seeds: Optional[Sequence[int]] = None,
) -> List[Cell]:
    """Every cell of ``budget`` (optionally only some tasks / method rows / seeds), each run once even
    when the main grid and the curve both need it (its ``purposes`` then name both)."""
    unknown = [t for t in (tasks or ()) if t not in TASKS] + [m for m in (methods or ()) if m not in METHOD_ROWS]
    if unknown:
        raise ValueError(
            f"unknown task or method row: {', '.join(unknown)} (tasks: {', '.join(TASKS)}; rows: {', '.join(METHOD_ROWS)})"
        )

    def wanted(task: str, method: str) -> bool:
        return (not tasks or task in tasks) and (not methods or method in methods)

    cells: Dict[Tuple, Cell] = {}

    def add(task: str, method: str, size: int, seed: int, first_seed: int, share: TaskBudget, purpose: str) -> None:
        if not wanted(task, method) or (seeds and seed not in seeds):
            return
        spec = TASKS[task]
        epoch_eval = budget.epoch_eval == "all" or (budget.epoch_eval == "first_seed" and seed == first_seed)
        cell = Cell(
            task=task, method=method, train_size=size, seed=seed,
            epochs=epochs_for(size, spec.train_batch_size, share.epochs, budget.min_steps),
            eval_samples=share.eval_samples, train_score_samples=share.train_score_samples,
            epoch_eval=epoch_eval, flags=share.extra_flags, purposes=(purpose,),
        )
        identity = (cell.task, cell.method, cell.train_size, cell.seed, cell.epochs, cell.eval_samples,
                    cell.train_score_samples, cell.epoch_eval, cell.flags)
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
        for size, seeds in budget.curve.sizes:
            for method in budget.curve.methods:
                for seed in seeds:
                    add(budget.curve.task, method, size, seed, first, share, "curve")
    return list(cells.values())
