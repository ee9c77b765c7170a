"""The recipes' method flags (``BitFitArguments``): ``--method``, the flags every method sees (BitFit's selection,
the head, the rates) and each method's own flags, composed from the methods' declarations (``Method.recipe``,
``tuners/<method>/recipe.py``).

Nothing here names a method: a method's flags given to another method are refused naming the methods that declare
them, ``--bias_terms`` given to a method that does not select biases is refused naming those that do, and the method
builds its config from the rest (``RecipeMethod.build``).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Tuple

from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.tuners.recipe import CommonFlags, FlagRefused, RecipeMethod, words
from bitfit_hf.tuners.roles import ALL_ROLES

__all__ = ["MethodArguments", "compose_method_arguments"]


@dataclass
class MethodArguments:
    """What to train: ``--method`` and the flags every method sees. :func:`compose_method_arguments` adds each method's
    own flags (and ``--method``'s choices and help)."""

    recipes: ClassVar[Mapping[str, RecipeMethod]] = {}  # every --method, in the registry's order
    own_arguments: ClassVar[Tuple[type, ...]] = ()  # the methods' own flag classes, each once, in the same order

    method: str = ""  # compose_method_arguments gives it its default, choices and help
    bias_terms: Optional[List[str]] = field(
        default=None,
        metadata={
            "help": "With --method bitfit: a preset (all, one-d = biases + LayerNorm gains, paper-subset) or "
            "roles such as `b_q b_m2`. Roles: "
            + " ".join(ALL_ROLES)
            + ". Default: all."
        },
    )
    bias_patterns: Optional[List[str]] = field(
        default=None, metadata={"help": "Extra regexes over full parameter names whose parameters are trained too."}
    )
    train_head: bool = field(default=True, metadata={"help": "Train the task head (--no_train_head freezes it)."})
    add_missing_biases: bool = field(
        default=False, metadata={"help": "Add zero-initialised biases where a selected role's module has none."}
    )
    bias_learning_rate: Optional[float] = field(
        default=None, metadata={"help": "Learning rate of the bias group (default: --learning_rate)."}
    )
    head_learning_rate: Optional[float] = field(
        default=None, metadata={"help": "Learning rate of the head group (default: --learning_rate)."}
    )
    save_full_model: bool = field(
        default=False, metadata={"help": "Save a full model checkpoint instead of the bias-only adapter."}
    )
    layerwise_lr_decay: Optional[float] = field(
        default=None,
        metadata={"help": "Layer-wise learning-rate decay, e.g. 0.9: layer l of L trains at lr*decay^(L-l); the "
                  "top layer, pooler, final norm and head keep the full rate. Default: off."},
    )
    role_learning_rates: Optional[List[str]] = field(
        default=None,
        metadata={"help": "Learning rates of single roles, ROLE=RATE ... (e.g. --role_learning_rates b_q=1e-2 "
                  "b_m2=1e-2: the paper finds the query bias and the FFN's intermediate bias move most); other biases "
                  "keep --bias_learning_rate. Default: off."},
    )
    added_bias_init: str = field(
        default="zero",
        metadata={"help": "Initial value of biases --add_missing_biases adds: zero (outputs unchanged) or "
                  "normal:MEAN,STD (e.g. normal:0,0.02; fixed seed)."},
    )

    def bitfit_config(self):
        """Deprecated name of :meth:`method_config`."""
        warnings.warn("BitFitArguments.bitfit_config() is deprecated: use method_config() (any method's config).",
                      FutureWarning, stacklevel=2)
        return self.method_config()

    def method_config(self):
        """The method config for ``--method`` and its flags (checked; raises RecipeError): what the method's
        ``build`` makes of the flags every method sees and of its own (``tuners/<method>/recipe.py``)."""
        recipe = self.recipes.get(self.method)
        if recipe is None:
            raise RecipeError(f"--method {self.method!r}: choose one of {', '.join(self.recipes)}.")
        common = CommonFlags(
            method=self.method, bias_terms=words(self.bias_terms), patterns=list(self.bias_patterns or []),
            train_head=self.train_head, add_missing_biases=self.add_missing_biases,
            bias_learning_rate=self.bias_learning_rate, head_learning_rate=self.head_learning_rate,
            save_full_model=self.save_full_model, layerwise_lr_decay=self.layerwise_lr_decay,
            added_bias_init=self.added_bias_init, role_learning_rates=role_rates(self.role_learning_rates),
        )
        try:
            self._refuse_flags_of_other_methods(recipe)
            if recipe.refuse is not None:
                recipe.refuse(common)
            if common.bias_terms and not recipe.bias_terms:
                raise FlagRefused(self._bias_terms_refusal(common.bias_terms, recipe))
            own = None
            if recipe.arguments is not None:
                own = recipe.arguments(**{f.name: getattr(self, f.name) for f in dataclasses.fields(recipe.arguments)})
            return recipe.build(common, own)
        except FlagRefused as err:
            raise RecipeError(str(err)) from None
        except ValueError as err:
            raise RecipeError(f"{self._flags_behind(str(err))}: {err}") from None

    def _refuse_flags_of_other_methods(self, recipe: RecipeMethod) -> None:
        """A flag of another method's own class, set to other than its default: refused, naming the methods that
        declare the class (as one group where the class has a ``flags_name``)."""
        for arguments in self.own_arguments:
            if arguments is recipe.arguments:
                continue
            given = [f.name for f in dataclasses.fields(arguments) if _is_set(getattr(self, f.name), f)]
            if not given:
                continue
            takers = " / ".join(name for name, other in self.recipes.items() if other.arguments is arguments)
            group = getattr(arguments, "flags_name", "")
            subject = f"{group} apply" if group else f"--{given[0]} applies"
            raise FlagRefused(f"{subject} to --method {takers} only (got --method {self.method}).")

    def _bias_terms_refusal(self, terms: List[str], recipe: RecipeMethod) -> str:
        """``--bias_terms`` given to a method that does not select biases: the first method that does, and the others."""
        takers = [name for name, other in self.recipes.items() if other.bias_terms]
        if not takers:
            return f"--bias_terms {' '.join(terms)}: no --method selects biases (got --method {self.method})."
        others = f"and {' / '.join(takers[1:])}; " if takers[1:] else ""
        message = f"--bias_terms {' '.join(terms)} applies to --method {takers[0]} only ({others}got --method {self.method})."
        return f"{message} {recipe.hint}" if recipe.hint else message

    def _flags_behind(self, message: str) -> str:
        """The flags a method-config error is about: those whose field the message names, else those
        given with a non-default value, else the selection flags and the method's own."""
        fields = [f.name for f in dataclasses.fields(self) if f.name not in ("method", "train_head")]
        named = [f for f in fields if f in message]
        named = [f for f in named if not any(f != g and f in g for g in named)]  # bias_terms in match_bias_terms
        if not named:
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            named = [f for f in fields if getattr(self, f) not in (defaults.get(f), None, [])]
        if not named:
            arguments = self.recipes[self.method].arguments
            own = [f.name for f in dataclasses.fields(arguments)] if arguments is not None else []
            named = ["bias_terms", "bias_patterns", *own]
        return " / ".join(f"--{f}" for f in named)


def _is_set(value: Any, spec: dataclasses.Field) -> bool:
    """A flag's value other than its default (an empty list counts as unset)."""
    if spec.default is not dataclasses.MISSING:
        default = spec.default
    elif spec.default_factory is not dataclasses.MISSING:
        default = spec.default_factory()
    else:
        return True
    return value != default and value is not None and value != []


@dataclass
class _RunFlags:
    """Flags of the run rather than of the method; after every method's flags in ``--help``."""

    eval_before_training: bool = field(
        default=True,
        metadata={"help": "Evaluate the untrained model first and report it as init_eval_* next to eval_*."},
    )


def compose_method_arguments(recipes: Mapping[str, RecipeMethod], default_method: str, rates_help: str, module: str,
                             name: str = "BitFitArguments") -> type:
    """The recipes' method-flag dataclass for these ``--method`` entries: ``--method`` (its choices, and its help
    from each method's ``help`` followed by ``rates_help``), the flags every method sees, each method's own flags
    (its ``arguments`` class, in the registry's order) and ``--eval_before_training``. ``module`` is where the class
    is bound to ``name`` (pickles find it there).

    A flag two methods' classes both declare, or one of the common flags, is a programming error (TypeError):
    methods that share flags share their class."""
    own: Dict[type, None] = {}
    for recipe in recipes.values():
        if recipe.arguments is not None:
            if not dataclasses.is_dataclass(recipe.arguments):
                raise TypeError(f"--method {recipe.name}: its arguments {recipe.arguments!r} are not a dataclass.")
            own.setdefault(recipe.arguments)
    seen = {f.name: "the common flags" for f in dataclasses.fields(MethodArguments)}
    seen.update({f.name: "the run flags" for f in dataclasses.fields(_RunFlags)})
    for arguments in own:
        for spec in dataclasses.fields(arguments):
            if spec.name in seen:
                raise TypeError(f"--{spec.name} of {arguments.__qualname__} is already one of {seen[spec.name]}.")
            seen[spec.name] = arguments.__qualname__
    helps = [text for text in dict.fromkeys(recipe.help for recipe in recipes.values()) if text]
    method_field = field(default=default_method, metadata={
        "help": "; ".join(helps) + (". " if helps else "") + rates_help, "choices": list(recipes)})
    cls = dataclasses.make_dataclass(
        name, [("method", str, method_field)], bases=(_RunFlags, *reversed(list(own)), MethodArguments),
        namespace={"recipes": dict(recipes), "own_arguments": tuple(own),
                   "__doc__": "What to train: --method, the flags every method sees and each method's own flags."},
    )
    cls.__module__ = module
    return cls


def role_rates(items: Optional[List[str]]) -> Optional[Dict[str, float]]:
    """``--role_learning_rates b_q=1e-2 b_m2=1e-2`` as ``{role: rate}``; a clear error for a malformed item."""
    if not items:
        return None
    rates = {}
    for item in words(items):
        role, _, rate = item.partition("=")
        try:
            rates[role] = float(rate)
        except ValueError:
            raise RecipeError(f"--role_learning_rates {item!r}: write ROLE=RATE, e.g. b_q=1e-2.") from None
    return rates
