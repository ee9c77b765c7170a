"""Methods: one folder per method (``config.py`` says what is trained, ``layer.py`` how one module
changes, ``model.py`` walks the network), plus what they share: the per-architecture role tables
(``roles.py``) and the registry below.

Every method config has a class attribute ``method`` (its registry name, stored in adapters) and
``learning_rate_for(role)``; every method's ``apply`` prepares a model in place and returns a state
with ``config``, ``selection`` (the trained tensors with their roles and layers), ``fingerprint``,
``added_biases`` and ``summary``, kept on the model (:func:`get_tuner_state`). A method that trains
only some entries of a tensor also gives ``sparse_indices`` (``{name: flat int64 indices}``): the
optimizer groups, the step guard and the adapter format handle those tensors generically. The trainer, the
adapter format and the reports work through that interface only, so a new method is a new folder
plus one :func:`register_method` line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from torch import nn

from bitfit_hf.tuners.adapterbias.config import AdapterBiasConfig
from bitfit_hf.tuners.adapterbias.model import apply_adapterbias, insert_shifts
from bitfit_hf.tuners.bias.config import BitFitConfig
from bitfit_hf.tuners.bias.model import BitFitState, apply_bitfit
from bitfit_hf.tuners.bitfit_lora.config import BitFitLoraConfig
from bitfit_hf.tuners.bitfit_lora.model import apply_bitfit_lora
from bitfit_hf.tuners.random_subset import RandRowColConfig, RandUniformConfig, apply_random_subset
from bitfit_hf.tuners.state import get_tuner_state  # noqa: F401 - part of the registry's interface
from bitfit_hf.utils.modes import inserted_modules_follow


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its config class and the function that prepares a model for it."""

    name: str
    config_class: type
    apply: Callable[[nn.Module, Any], BitFitState]
    description: str = ""
    # Inserts the modules an adapter's tensors live in (idempotent), before those tensors are loaded
    # into a stock model (AdapterBank, load_adapter); None: the method adds no modules.
    prepare_base: Optional[Callable[[nn.Module, Any], Any]] = None
    # The method's tensors live in modules a stock model lacks until the method prepares it (AdapterBias's
    # shifts, LoRA's branches): an adapter's names missing from a stock model are expected, not damage.
    inserts_modules: bool = False
    # Why the trained model cannot become a plain checkpoint (export_merged) nor be routed per example
    # as bias deltas (MultiTaskModel); "" for methods that train only additive biases and heads.
    not_mergeable: str = ""
    display_name: str = ""  # how model cards name the method ("AdapterBias")
    paper: str = ""  # "Title (venue): url", for model cards
    citation: str = ""  # BibTeX, for model cards
    # A variant of the method that a config describes, for model cards: the method's config ->
    # (display_name, description), or None for the method as registered.
    card_variant: Optional[Callable[[Any], Optional[Tuple[str, str]]]] = None


METHODS: Dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> None:
    METHODS[spec.name] = spec


def method_spec(name: str) -> MethodSpec:
    """The registered method ``name``; a clear error naming the known ones otherwise."""
    if name not in METHODS:
        raise ValueError(f"Unknown method {name!r}: this version of bitfit-hf knows {', '.join(sorted(METHODS))}. "
                         "An adapter written by a newer version needs that version.")
    return METHODS[name]


def apply_method(model: nn.Module, config: Optional[Any] = None) -> BitFitState:
    """Prepare ``model`` in place for the method of ``config`` (default: BitFit on all biases). Modules the
    method inserts take the model's mode (no LoRA dropout in a model in eval mode)."""
    config = config if config is not None else BitFitConfig()
    spec = method_spec(getattr(config, "method", "bitfit"))
    with inserted_modules_follow(model):
        return spec.apply(model, config)


def method_label(config: Any) -> str:
    """The recipes' ``--method`` name of a method config or an adapter config: ``lora`` for BitFit + LoRA
    training no bias term, ``frozen`` / ``full`` for BitFit's head-only and full presets, else the registered
    method (``bitfit``, ``bitfit_lora``, ``adapterbias``, ``rand_uniform``, ...)."""
    method = getattr(config, "method", "bitfit") or "bitfit"
    terms = getattr(config, "bias_terms", None)
    terms = [terms] if isinstance(terms, str) else list(terms or [])
    if method == "bitfit_lora" and terms == ["frozen"]:
        return "lora"
    if method == "bitfit" and terms in (["frozen"], ["full"]):
        return terms[0]
    return method


def config_from_dict(method: str, data: Dict[str, Any]):
    """A method config rebuilt from its serialised fields."""
    return method_spec(method).config_class.from_dict(data)


register_method(MethodSpec("bitfit", BitFitConfig, apply_bitfit, "bias terms (all, presets, paper roles or patterns) + head"))
register_method(MethodSpec("rand_uniform", RandUniformConfig, apply_random_subset,
                           "baseline: as many random weight entries as a bias selection (uniform)"))
register_method(MethodSpec("rand_row_col", RandRowColConfig, apply_random_subset,
                           "baseline: as many weight entries as a bias selection, in random whole rows/columns"))
register_method(MethodSpec(
    "adapterbias", AdapterBiasConfig, apply_adapterbias,
    "a token-dependent shift L_alpha(h)*v on each FFN output projection, the FFN and embeddings LayerNorms "
    "(gain and bias) and the task head",
    prepare_base=insert_shifts,
    inserts_modules=True,
    display_name="AdapterBias",
    not_mergeable=("AdapterBias adds a token-dependent shift L_alpha(h)*v to each FFN output (its size depends on "
                   "each token's hidden state), which no bias or weight of the stock architecture can hold"),
    paper="AdapterBias: Parameter-efficient Token-dependent Representation Shift for Adapters in NLP Tasks "
          "(Fu et al., Findings of NAACL 2022): https://aclanthology.org/2022.findings-naacl.199",
    citation="""@inproceedings{fu-etal-2022-adapterbias,
    title = "{A}dapter{B}ias: Parameter-efficient Token-dependent Representation Shift for Adapters in {NLP} Tasks",
    author = "Fu, Chin-Lun and Chen, Zih-Ching and Lee, Yun-Ru and Lee, Hung-yi",
    booktitle = "Findings of the Association for Computational Linguistics: NAACL 2022",
    year = "2022",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2022.findings-naacl.199",
    pages = "2608--2621",
}""",
))


def _lora_card_variant(config: BitFitLoraConfig) -> Optional[Tuple[str, str]]:
    """The recipes' ``--method lora`` is BitFit + LoRA with no bias: its card must not claim biases."""
    if list(config.bias_terms or []) == ["frozen"]:
        return "LoRA", "peft LoRA matrices (default: query and value projections) + head, no bias term"
    return None


register_method(MethodSpec("bitfit_lora", BitFitLoraConfig, apply_bitfit_lora,
                           "bias terms + head, plus peft LoRA matrices (default: query and value projections)",
                           inserts_modules=True, display_name="BitFit + LoRA", card_variant=_lora_card_variant))
