"""How the recipes offer a method: its ``--method`` names, its own flags, and how they become its config.

A method folder declares, in its ``recipe.py``, one :class:`RecipeMethod` per ``--method`` name it answers to
(the ``bitfit`` folder also answers to ``full`` and ``frozen``, ``bitfit_lora`` to ``lora``): a plain dataclass of
its own flags (``HfArgumentParser`` fields with their help texts) and ``build(common, own)``, which makes its config
from the flags every method sees (:class:`CommonFlags`) and its own. The method's registration exposes them
(``Method.recipe``). ``recipe_kit/method_args.py`` composes every method's flags into the recipes'
``BitFitArguments``, refuses a method's flags given to another method (naming the methods that take them) and names
no method itself.

Shared by the method folders; it knows no method, and imports nothing from the recipes (tuners sit below them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


class FlagRefused(Exception):
    """A flag, or a combination of flags, the method does not take: the message is complete (it names the flags),
    and the recipes print it as it is. A bad *value* is a ``ValueError`` of the config instead: the recipes name the
    flag behind it."""


def words(values: Optional[Sequence[str]]) -> List[str]:
    """A list flag's values split at commas and spaces (``--bias_terms "b_q, b_v"`` is ``b_q b_v``)."""
    return [word for value in (values or []) for word in str(value).replace(",", " ").split()]


@dataclass(frozen=True)
class CommonFlags:
    """The recipe flags every method sees: ``--method`` and BitFit's selection, head and rate flags (``--bias_terms``
    split into words, ``--bias_patterns`` as ``patterns``)."""

    method: str
    bias_terms: List[str]
    patterns: List[str]
    train_head: bool
    add_missing_biases: bool
    bias_learning_rate: Optional[float]
    head_learning_rate: Optional[float]
    save_full_model: bool
    layerwise_lr_decay: Optional[float]
    added_bias_init: str
    role_learning_rates: Optional[Dict[str, float]] = None

    def bitfit_fields(self) -> Dict[str, Any]:
        """The ``BitFitConfig`` fields these flags set, ``bias_terms`` aside (what a method selects is its own)."""
        return dict(patterns=list(self.patterns), train_head=self.train_head, add_missing_biases=self.add_missing_biases,
                    bias_learning_rate=self.bias_learning_rate, head_learning_rate=self.head_learning_rate,
                    save_full_model=self.save_full_model, layerwise_lr_decay=self.layerwise_lr_decay,
                    added_bias_init=self.added_bias_init, role_learning_rates=self.role_learning_rates)


@dataclass(frozen=True)
class RecipeMethod:
    """One ``--method`` of the recipes.

    Args:
        name: the ``--method`` name.
        build: ``(common flags, own flags)`` -> the method's config; ``own`` is an instance of ``arguments`` (``None``
            without). A bad value raises ``ValueError`` (the config's own checks), a flag it does not take
            :class:`FlagRefused`.
        arguments: a dataclass of the method's own flags (fields with defaults and ``metadata={"help": ...}``, as
            ``HfArgumentParser`` reads them). Methods of one folder may share it (``lora`` / ``bitfit_lora``); given
            to any other method, one of its flags with a value other than its default is refused, naming the methods
            that declare it. A class attribute ``flags_name`` (``"--lora_* flags"``) refuses them as one group.
        help: its part of ``--method``'s help (``"bitfit: bias terms + task head"``); methods sharing one text say
            it once.
        bias_terms: ``--bias_terms`` is its selection. A method without it refuses the flag, naming those with it.
        refuse: ``common flags -> None``: refuses (:class:`FlagRefused`) common flags in its own words, before the
            generic refusal of ``--bias_terms``.
        hint: a sentence said after the generic refusal of ``--bias_terms`` to this method.
        default_learning_rate: the learning rate without ``--learning_rate`` (the recipes'
            ``DEFAULT_LEARNING_RATES`` is read from these).
        base_size_learning_rate: the learning rate without ``--learning_rate`` on a model at least
            ``BASE_SIZE_WIDTH`` (768) wide, where it differs from ``default_learning_rate``: measured on
            all-mpnet-base-v2 (:mod:`bitfit_hf.recipe_kit.model_size`); ``None``: the same rate on every size.
        learning_rate_like: the ``--method`` whose recipe-specific offline learning rate it follows when the recipe
            gives none for it (the random baselines follow ``bitfit``); ``""``: its own only.
        output_suffix: ``(own boolean flag, suffix)`` pairs: the flag set keeps a run's default output folder apart
            (``("share_alpha", "-shared")``).
        probe_head_start: the recipes start its head from the converged linear probe unless
            ``--probe_head_start false`` (:mod:`bitfit_hf.training.probe`): where that was measured to win.
    """

    name: str
    build: Callable[[CommonFlags, Any], Any]
    arguments: Optional[type] = None
    help: str = ""
    bias_terms: bool = False
    refuse: Optional[Callable[[CommonFlags], None]] = None
    hint: str = ""
    default_learning_rate: Optional[float] = None
    base_size_learning_rate: Optional[float] = None
    learning_rate_like: str = ""
    output_suffix: Tuple[Tuple[str, str], ...] = ()
    probe_head_start: bool = False
