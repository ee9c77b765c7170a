"""Command-line arguments shared by the recipes, and how their defaults are chosen.

Every recipe parses four dataclasses with :class:`transformers.HfArgumentParser`:
:class:`ModelArguments`, a recipe-specific subclass of :class:`DataArguments` (both in
:mod:`~bitfit_hf.recipe_kit.arg_groups`), :class:`BitFitArguments` and :class:`transformers.TrainingArguments` (every
standard flag). ``BitFitArguments`` holds ``--method``, the flags every method sees and each registered method's own
flags, composed from the method folders (``tuners/<method>/recipe.py``, :mod:`~bitfit_hf.recipe_kit.method_args`).

Defaults the user did not set explicitly are filled in before ``TrainingArguments`` is built
(:func:`parse_recipe_args`), so ``__post_init__`` sees the final values:

* ``--learning_rate`` follows ``--method`` (``DEFAULT_LEARNING_RATES``: each method folder's
  ``RecipeMethod.default_learning_rate``, from a sweep on the GLUE recipe's default budget; a recipe may set its own
  for its offline default run) and the model's width: a model at least 768 wide takes the method's
  ``base_size_learning_rate`` where it has one (:mod:`~bitfit_hf.recipe_kit.model_size`).
* ``--use_cpu`` is on when no accelerator is present (needed for multi-process CPU launches; see
  :func:`default_use_cpu`).
* no ``--do_train/--do_eval/--do_predict`` at all means ``--do_train --do_eval``;
* ``--output_dir`` defaults to ``outputs/<recipe>-<task>-<method>`` (a method's own flag may keep its runs
  apart: ``-shared`` added for AdapterBias with ``--share_alpha``, ``RecipeMethod.output_suffix``);
* each recipe's batch sizes and logging cadence, and, when the offline default data is used, the
  sample caps that keep the default run to a few minutes on a 2-core CPU.

An explicit flag (or a key of a ``.json`` / ``.yaml`` arguments file) always wins.

``RECIPE_METHODS``, ``METHODS``, ``DEFAULT_LEARNING_RATES``, ``METHOD_RATES_HELP`` and ``BitFitArguments`` are read
from the method registry when asked for (module attributes computed on access), so a method registered after this
module was imported is a ``--method`` choice too.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from bitfit_hf.recipe_kit.arg_groups import (
    DataArguments,
    ModelArguments,
    check_data_args,
    check_training_args,
    recipe_training_class,
)
from bitfit_hf.recipe_kit.argv import (
    PATH_FLAGS,
    expand_home,
    expand_home_in_argv,
    given_keys,
    group_by_length_alias,
    group_by_length_key,
    load_args_file,
    task_label,
    to_argv,
)
from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.recipe_kit.method_args import compose_method_arguments
from bitfit_hf.recipe_kit.model_size import BASE_SIZE_WIDTH, is_base_size, model_width
from bitfit_hf.tuners import recipe_methods
from bitfit_hf.utils.constants import DEFAULT_MODEL_ID

__all__ = [  # noqa: F822 - the registry's names resolve in __getattr__
    "DEFAULT_MODEL_ID",
    "DEFAULT_LEARNING_RATES",
    "DEFAULT_METHOD",
    "METHODS",
    "RECIPE_METHODS",
    "ModelArguments",
    "DataArguments",
    "BitFitArguments",
    "RecipeDefaults",
    "ParsedArgs",
    "check_data_args",
    "check_training_args",
    "default_use_cpu",
    "parse_recipe_args",
    "recipe_training_class",
]

DEFAULT_METHOD = "bitfit"

#: Flags that name the model, read before parsing: the default learning rate follows the model's width.
MODEL_FLAGS = ("model_name_or_path", "config_name", "model_revision", "gguf_file")

#: Flags that select the data; none of them given means "use the recipe's offline default data".
DATA_SOURCE_FLAGS = ("dataset_name", "train_file", "validation_file", "test_file", "task_name")


def _rate_list(rates: dict) -> str:
    by_rate: dict = {}
    for method, rate in rates.items():
        by_rate.setdefault(rate, []).append(method)
    return "; ".join(f"{rate:.0e}".replace("e-0", "e-") + f" ({', '.join(methods)})"
                     for rate, methods in sorted(by_rate.items()))


def _rates_help(rates: dict, base_rates: Optional[dict] = None) -> str:
    """The end of ``--method``'s help (each method's own part comes from its folder: ``RecipeMethod.help``)."""
    text = f"The learning rate defaults to {_rate_list(rates)}"
    if base_rates:
        text += (f"; on a model with hidden size >= {BASE_SIZE_WIDTH} (BERT-base and up) to {_rate_list(base_rates)} "
                 "for these methods")
    return text + " unless --learning_rate is given."


def default_rate_for_model(recipe, rate: Optional[float], model_name_or_path: Optional[str], default_asset: str,
                           revision: Optional[str] = None, gguf_file: Optional[str] = None,
                           read_width: Optional[Callable[[], Optional[int]]] = None):
    """``(rate, note)``: the method's default learning rate for the model named, and the sentence the run's log says
    about the choice ("" when the small-model rate stands unremarked). Only a method with a base-size rate of its own
    (``RecipeMethod.base_size_learning_rate``) reads the model's width (through ``read_width`` where given: one read
    per command line)."""
    base = recipe.base_size_learning_rate
    if base is None or base == rate:
        return rate, ""
    width = read_width() if read_width else model_width(model_name_or_path, default_asset, revision, gguf_file)
    shown = model_name_or_path or default_asset
    if width is None:
        return rate, (f"--learning_rate {rate:g}: the small-model default of --method {recipe.name}, since the width of "
                      f"{shown} could not be read before loading; on a model with hidden size >= {BASE_SIZE_WIDTH} "
                      f"pass --learning_rate {base:g}, the base-size default.")
    if is_base_size(width):
        return base, (f"--learning_rate {base:g}: the base-size default of --method {recipe.name} ({shown} has hidden "
                      f"size {width}; {rate:g} is its default on smaller models). Pass --learning_rate to choose.")
    return rate, ""


def default_probe_head_start(method: str, defaults: "RecipeDefaults", recipe, model_name_or_path: Optional[str],
                             read_width: Callable[[], Optional[int]]):
    """``(on, note)``: whether ``--method`` starts from the converged probe without ``--probe_head_start``, and the
    sentence the run's log says about it ("" where nothing needs saying). Only a method in
    ``defaults.small_model_probe_head_start`` calls ``read_width`` (the width of ``model_name_or_path``)."""
    if recipe.probe_head_start or method in defaults.probe_head_start:
        return True, ""
    if method not in defaults.small_model_probe_head_start:
        return False, ""
    width = read_width()
    shown = model_name_or_path or defaults.default_model_asset
    if width is None:
        return False, (f"--probe_head_start false: --method {method} starts from the converged probe on models "
                       f"narrower than {BASE_SIZE_WIDTH} only, and the width of {shown} could not be read before "
                       "loading. Pass --probe_head_start to start from it.")
    if is_base_size(width):
        return False, (f"--probe_head_start false: on a base-size model ({shown} has hidden size {width}) --method "
                       f"{method} starts from a random head; the converged probe is its default on models narrower "
                       f"than {BASE_SIZE_WIDTH} only (docs/probe-head-start.md). Pass --probe_head_start to start from "
                       "it anyway.")
    return True, ""


_COMPOSED: Dict[str, Any] = {}  # what was last composed from the registry, and the registry's recipes it came from


def _composed() -> Dict[str, Any]:
    """The registry's ``--method`` entries and what the recipes compose from them, rebuilt when the registry changes
    (the same ``BitFitArguments`` class otherwise: pickles of its instances find it)."""
    recipes = recipe_methods()
    key = tuple((name, id(recipe)) for name, recipe in recipes.items())
    if _COMPOSED.get("key") != key:
        rates = {name: recipe.default_learning_rate for name, recipe in recipes.items()
                 if recipe.default_learning_rate is not None}
        base_rates = {name: recipe.base_size_learning_rate for name, recipe in recipes.items()
                      if recipe.base_size_learning_rate not in (None, recipe.default_learning_rate)}
        rates_help = _rates_help(rates, base_rates)
        _COMPOSED.clear()
        _COMPOSED.update(key=key, RECIPE_METHODS=recipes, METHODS=tuple(recipes), DEFAULT_LEARNING_RATES=rates,
                         METHOD_RATES_HELP=rates_help,
                         BitFitArguments=compose_method_arguments(recipes, DEFAULT_METHOD, rates_help, __name__))
    return _COMPOSED


#: Names read from the registry on access: every ``--method`` with its flags and config builder
#: (``tuners/<method>/recipe.py``), their names, their default learning rates, the end of ``--method``'s help, and the
#: recipes' method-flag dataclass (``--method``, the flags every method sees, each method's own flags;
#: ``bitfit_config()`` is the method's config).
_FROM_REGISTRY = ("RECIPE_METHODS", "METHODS", "DEFAULT_LEARNING_RATES", "METHOD_RATES_HELP", "BitFitArguments")


# --------------------------------------------------------------------------- device


#: Flags that transformers renamed or dropped, with what takes their place.
_RENAMED_FLAGS = {"--warmup_ratio": "--warmup_steps (a value below 1 is a fraction of the training steps, as "
                                    "--warmup_ratio was: --warmup_steps 0.1)",
                  "--evaluation_strategy": "--eval_strategy"}


def _field_names(parser) -> set:
    """Every option the recipe's argument dataclasses define (their field names)."""
    import dataclasses

    return {f.name for kind in parser.dataclass_types for f in dataclasses.fields(kind)}


def _nearest_hint(flags: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """For each unknown ``--flag``: what replaced it, or the nearest option the recipe knows; then where to look."""
    import difflib

    options = [f"--{name}" for name in _field_names(parser)]
    hints = []
    for flag in dict.fromkeys(f.split("=", 1)[0] for f in flags):
        if flag in _RENAMED_FLAGS:
            hints.append(f"{flag}: use {_RENAMED_FLAGS[flag]}")
        else:
            close = difflib.get_close_matches(flag, options, n=1, cutoff=0.75)
            if close:
                hints.append(f"{flag}: did you mean {close[0]}?")
    return ("; ".join(hints) + ". " if hints else "") + "Run the recipe with --help for every option."


def default_use_cpu() -> bool:
    """Whether ``TrainingArguments.use_cpu`` should default to True: no accelerator is present.

    The single place where the recipes decide this; it delegates to the library's backend selection
    (:func:`bitfit_hf.training.distributed.default_use_cpu`). Multi-process CPU launches need it: with
    ``use_cpu=False`` each rank trains alone (see the distributed notes).
    """
    from bitfit_hf.training.backend import default_use_cpu as _default_use_cpu

    return _default_use_cpu()


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class RecipeDefaults:
    """A recipe's own defaults (applied only to flags the user did not give).

    Args:
        recipe: short name, used in the default output directory.
        training: TrainingArguments / data defaults for every run (batch sizes, epochs, ...).
        offline: extra defaults when the recipe runs on its offline default dataset.
        offline_dataset: name of that dataset (see :data:`bitfit_hf.recipe_kit.data.OFFLINE_DATASETS`).
        offline_task: ``task_name`` implied by the offline dataset (GLUE: ``sst2``), if the recipe has one.
        offline_learning_rates: per-method learning rates for the offline default run, where the step
            budget is small (SQuAD: a higher BitFit rate); other methods keep :data:`DEFAULT_LEARNING_RATES`.
        default_model_asset: the model asset (:data:`bitfit_hf.data.assets.MODEL_ASSETS`) a run without
            ``--model_name_or_path`` uses, fetched before anything is loaded.
        probe_head_start: the methods this recipe starts from the converged linear probe unless
            ``--probe_head_start false`` (besides those whose ``RecipeMethod.probe_head_start`` says so): where it
            was measured to win on this recipe's task.
        small_model_probe_head_start: the methods it starts from the probe on models narrower than base size only
            (:mod:`~bitfit_hf.recipe_kit.model_size`): where it won on a small encoder and lost on a base-size one.
    """

    recipe: str
    offline_dataset: str
    training: Dict[str, Any] = field(default_factory=dict)
    offline: Dict[str, Any] = field(default_factory=dict)
    offline_task: Optional[str] = None
    offline_learning_rates: Dict[str, float] = field(default_factory=dict)
    default_model_asset: str = "minilm"
    probe_head_start: Tuple[str, ...] = ()
    small_model_probe_head_start: Tuple[str, ...] = ()


@dataclass
class ParsedArgs:
    model: ModelArguments
    data: DataArguments
    bitfit: Any  # the recipes' BitFitArguments
    training: Any  # transformers.TrainingArguments
    applied_defaults: Dict[str, Any]
    offline_data: bool
    notes: List[str] = field(default_factory=list)  # what the run's log says about defaults chosen for it

    def __iter__(self):  # model_args, data_args, bitfit_args, training_args = parse_recipe_args(...)
        return iter((self.model, self.data, self.bitfit, self.training))


def __getattr__(name: str):
    """The registry's names (:data:`_FROM_REGISTRY`) and ``RecipeTrainingArguments`` resolve lazily (an unpickled
    ``training_args.bin`` looks the latter up here)."""
    if name in _FROM_REGISTRY:
        return _composed()[name]
    if name == "RecipeTrainingArguments":
        from transformers import TrainingArguments

        return recipe_training_class(TrainingArguments)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The environment variable the ``bitfit-hf train`` command sets to the words that ran the recipe, for its usage line
#: and its error lines (``bitfit-hf train glue``; ``glue.py`` when the script runs itself).
PROG_ENV = "BITFIT_HF_PROG"


def recipe_prog() -> str:
    """What the recipe is called in its usage and error lines."""
    return os.environ.get(PROG_ENV) or os.path.basename(sys.argv[0])


def default_notes(method: str, rate_follows_model: bool, method_small_only: bool = False) -> Dict[str, str]:
    """Where each default a recipe sets comes from, for ``--help`` (keyed by flag name; other recipe defaults read
    "this recipe's default")."""
    return {
        "learning_rate": f"--method {method}'s default" + (", for this model's width" if rate_follows_model else
                                                           f"; {BASE_SIZE_WIDTH} or more wide models may take another, "
                                                           "see --method"),
        "use_cpu": "no accelerator found",
        "do_train": "neither --do_train, --do_eval nor --do_predict given",
        "do_eval": "neither --do_train, --do_eval nor --do_predict given",
        "output_dir": "outputs/<recipe>-<task>-<method>",
        "probe_head_start": f"--method {method} starts from the converged probe"
                            + (" on this model" if method_small_only else ""),
    }


def recipe_parser(dataclass_types, help_notes: Optional[Dict[str, str]] = None):
    """``HfArgumentParser`` over the recipe's dataclasses, named as the recipe was run (:func:`recipe_prog`).

    Every ``--no_X`` switch gets its own help (transformers gives it the positive flag's); with ``help_notes``
    (flag name -> where the run's default comes from) each such flag's help says so, for ``--help``."""
    from transformers import HfArgumentParser

    class RecipeArgumentParser(HfArgumentParser):
        def __init__(self, types, notes):
            self.help_notes = dict(notes or {})
            super().__init__(types, prog=recipe_prog())

        def add_argument(self, *names, **kwargs):
            first = names[0] if names else ""
            if first.startswith("--no_"):
                kwargs["help"] = f"Turn off --{first[5:]} (the same as --{first[5:]} false)."
            elif first[2:] in self.help_notes and "help" in kwargs:
                kwargs["help"] = f"{kwargs['help'] or ''} [default set by the recipe: {self.help_notes[first[2:]]}]"
            return super().add_argument(*names, **kwargs)

    return RecipeArgumentParser(dataclass_types, help_notes)


@dataclass
class CommandLineFacts:
    """What a recipe's defaults depend on, read from the command line (or arguments file) before the full parse."""

    given: set  # flag names the user set
    method: str
    model: Dict[str, Optional[str]]  # MODEL_FLAGS
    switches: Dict[str, Any]  # the methods' output-suffix flags
    dataset_name: Optional[str]
    file_values: Optional[Dict[str, Any]] = None  # the arguments file's keys, when the run was given one


def read_command_line_facts(argv: List[str], training_class: type, suffix_flags: List[str]) -> CommandLineFacts:
    """The flags the defaults depend on: from a lone ``.json`` / ``.yaml`` arguments file, or from ``argv`` by a
    permissive first pass (the full parse, which knows every flag, comes after the defaults are chosen)."""
    if len(argv) == 1 and argv[0].endswith((".json", ".yaml", ".yml")):
        values = load_args_file(os.path.abspath(os.path.expanduser(argv[0])))
        values = {k: expand_home(v) if k in PATH_FLAGS else v for k, v in values.items()}
        values = group_by_length_key(values, training_class)
        return CommandLineFacts(set(values), values.get("method", DEFAULT_METHOD),
                                {key: values.get(key) for key in MODEL_FLAGS},
                                {flag: values.get(flag, False) for flag in suffix_flags}, values.get("dataset_name"),
                                values)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--method", default=DEFAULT_METHOD)
    pre.add_argument("--dataset_name", "--dataset-name", default=None)
    for key in MODEL_FLAGS:
        pre.add_argument(f"--{key}", f"--{key.replace('_', '-')}", default=None)
    for flag in suffix_flags:
        pre.add_argument(f"--{flag}", nargs="?", const="true", default="false")
    known, _ = pre.parse_known_args(argv)
    return CommandLineFacts(given_keys(argv), known.method, {key: getattr(known, key) for key in MODEL_FLAGS},
                            {flag: getattr(known, flag) for flag in suffix_flags}, known.dataset_name)


@dataclass
class ChosenDefaults:
    """The values a recipe sets for flags the user left out, and what the run's log and ``--help`` say of them."""

    values: Dict[str, Any]
    offline_data: bool
    notes: List[str]
    rate_follows_model: bool


def choose_defaults(facts: CommandLineFacts, defaults: RecipeDefaults, data_class: type) -> ChosenDefaults:
    """The recipe's defaults for this run: offline data and its caps when no data source is named, the method's
    learning rate (the recipe's offline rate, then the model's width), the probe head start, the device and the
    do_train / do_eval switches. Flags the user set are left out by the caller."""
    composed = _composed()
    recipes, rates = composed["RECIPE_METHODS"], composed["DEFAULT_LEARNING_RATES"]
    method, recipe = facts.method, recipes[facts.method]
    data_fields = set(getattr(data_class, "__dataclass_fields__", {}))
    sources = [flag for flag in DATA_SOURCE_FLAGS if flag in data_fields]
    offline_data = not any(flag in facts.given for flag in sources) or facts.dataset_name == defaults.offline_dataset

    chosen: Dict[str, Any] = {}
    if offline_data:
        chosen["dataset_name"] = defaults.offline_dataset
        if defaults.offline_task and "task_name" in data_fields:
            chosen["task_name"] = defaults.offline_task
        chosen.update(defaults.offline)
    chosen.update(defaults.training)
    if method in rates:  # a method without a default rate gets TrainingArguments' own
        chosen["learning_rate"] = rates[method]
    like = recipe.learning_rate_like  # the random baselines follow BitFit's offline rate
    rate_key = like if like and method not in defaults.offline_learning_rates else method
    owner = recipe  # whose base-size rate a wide model gets: the method whose rate was taken
    if offline_data and rate_key in defaults.offline_learning_rates:
        chosen["learning_rate"] = defaults.offline_learning_rates[rate_key]
        owner = recipes[rate_key]
    notes: List[str] = []
    model = facts.model
    sized = model["config_name"] or model["model_name_or_path"]  # read once, only if a default depends on it
    read_width = functools.cache(lambda: model_width(sized, defaults.default_model_asset, model["model_revision"],
                                                     model["gguf_file"]))
    if "learning_rate" not in facts.given and "learning_rate" in chosen:
        chosen["learning_rate"], note = default_rate_for_model(
            owner, chosen["learning_rate"], sized, defaults.default_model_asset, model["model_revision"],
            model["gguf_file"], read_width)
        notes += [note] if note else []
    rate_follows_model = bool(notes)
    if "probe_head_start" not in facts.given:
        head_start, note = default_probe_head_start(method, defaults, recipe, sized, read_width)
        if head_start:
            chosen["probe_head_start"] = True
        notes += [note] if note else []
    if default_use_cpu():
        chosen["use_cpu"] = True
    if not facts.given & {"do_train", "do_eval", "do_predict"}:
        chosen["do_train"] = True
        chosen["do_eval"] = True
    return ChosenDefaults(chosen, offline_data, notes, rate_follows_model)


def parse_recipe_args(
    data_class: type,
    defaults: RecipeDefaults,
    argv: Optional[Sequence[str]] = None,
    training_class: Optional[type] = None,
) -> ParsedArgs:
    """Parse a recipe's command line (or a single ``.json`` / ``.yaml`` arguments file).

    Returns a :class:`ParsedArgs` that unpacks as ``model_args, data_args, bitfit_args, training_args``.
    """
    from transformers import TrainingArguments

    training_class = training_class or recipe_training_class(TrainingArguments)
    argv = expand_home_in_argv(list(sys.argv[1:] if argv is None else argv))
    argv = group_by_length_alias(argv, training_class)
    composed = _composed()
    recipes = composed["RECIPE_METHODS"]
    types = (ModelArguments, data_class, composed["BitFitArguments"], training_class)

    # A method's own boolean flags that keep its runs' default output folders apart (--share_alpha: -shared).
    suffix_flags = list(dict.fromkeys(flag for recipe in recipes.values() for flag, _ in recipe.output_suffix))
    facts = read_command_line_facts(argv, training_class, suffix_flags)
    method = facts.method
    if method not in recipes:
        raise RecipeError(f"--method {method!r}: choose one of {', '.join(recipes)}.")
    chosen = choose_defaults(facts, defaults, data_class)
    applied = {key: value for key, value in chosen.values.items() if key not in facts.given}
    if "output_dir" not in facts.given:
        task = task_label(argv, facts.file_values, applied, defaults.recipe)
        variant = "".join(suffix for flag, suffix in recipes[method].output_suffix
                          if str(facts.switches[flag]).lower() in ("true", "1", "yes"))
        applied["output_dir"] = os.path.join("outputs", f"{defaults.recipe}-{task}-{method}{variant}")

    parser = recipe_parser(types)
    if facts.file_values is None and {"-h", "--help"} & set(argv):  # the help shows the values this run would use
        known_notes = default_notes(method, chosen.rate_follows_model, method in defaults.small_model_probe_head_start)
        parser = recipe_parser(types, {key: known_notes.get(key, "this recipe's default") for key in applied})
        parser.set_defaults(**applied)

    if facts.file_values is not None:
        known = _field_names(parser)
        unknown_keys = [key for key in facts.file_values if key not in known]
        if unknown_keys:
            raise RecipeError(f"unknown key(s) in {argv[0]}: {', '.join(unknown_keys)}. "
                              + _nearest_hint([f"--{key}" for key in unknown_keys], parser))
        parsed = parser.parse_dict({**applied, **facts.file_values})
    else:
        *parsed, remaining = parser.parse_args_into_dataclasses(args=to_argv(applied) + argv, look_for_args_file=False,
                                                                 return_remaining_strings=True)
        if remaining:
            raise RecipeError(f"unknown option(s): {' '.join(remaining)}. "
                              + _nearest_hint([s for s in remaining if s.startswith("--")], parser))
    model_args, data_args, bitfit_args, training_args = parsed
    return ParsedArgs(model_args, data_args, bitfit_args, training_args, applied, chosen.offline_data, chosen.notes)
