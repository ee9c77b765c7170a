"""Methods: one folder per method (``config.py`` says what is trained, ``layer.py`` how one module
changes, ``model.py`` walks the network, ``recipe.py`` what the recipes offer: its ``--method`` names, its own flags
and how they become its config), plus what they share: the per-architecture role tables (``roles.py``) and the
registry below.

Every method config has a class attribute ``method`` (its registry name, stored in adapters) and
``learning_rate_for(role)``; every method's ``apply`` prepares a model in place and returns a state
with ``config``, ``selection`` (the trained tensors with their roles and layers), ``fingerprint``,
``added_biases`` and ``summary``, kept on the model (:func:`get_tuner_state`). A method that trains
only some entries of a tensor also gives ``sparse_indices`` (``{name: flat int64 indices}``): the
optimizer groups, the step guard and the adapter format handle those tensors generically. The trainer, the
adapter format, the reports and the recipes' arguments work through that interface only, so a new method is a new
folder plus one :func:`register_method` line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from torch import nn

from bitfit_hf.tuners.adapterbias import recipe as adapterbias_recipe
from bitfit_hf.tuners.adapterbias.config import AdapterBiasConfig
from bitfit_hf.tuners.adapterbias.model import (
    adapterbias_tensor_role,
    apply_adapterbias,
    insert_shifts,
    l0_penalty,
    release_adapter,
)
from bitfit_hf.tuners.bias.config import BitFitConfig
from bitfit_hf.tuners.bias.model import BitFitState, apply_bitfit
from bitfit_hf.tuners.bitfit import recipe as bitfit_recipe
from bitfit_hf.tuners.bitfit_ia3 import layer as ia3_layer
from bitfit_hf.tuners.bitfit_ia3 import recipe as ia3_recipe
from bitfit_hf.tuners.bitfit_ia3.config import IA3, BitFitIA3Config, IA3Config
from bitfit_hf.tuners.bitfit_ia3.layer import is_ia3_tensor
from bitfit_hf.tuners.bitfit_ia3.model import apply_bitfit_ia3
from bitfit_hf.tuners.bitfit_ia3.model import bank_attach as ia3_bank_attach
from bitfit_hf.tuners.bitfit_ia3.model import peft_model as ia3_peft_model
from bitfit_hf.tuners.bitfit_lora import layer as lora_bank
from bitfit_hf.tuners.bitfit_lora import recipe as lora_recipe
from bitfit_hf.tuners.bitfit_lora.config import LORA, BitFitLoraConfig
from bitfit_hf.tuners.bitfit_lora.layer import is_lora_tensor
from bitfit_hf.tuners.bitfit_lora.model import apply_bitfit_lora
from bitfit_hf.tuners.random_subset import RandRowColConfig, RandUniformConfig, apply_random_subset
from bitfit_hf.tuners.random_subset import recipe as random_recipe
from bitfit_hf.tuners.random_subset.model import RANDOM
from bitfit_hf.tuners.recipe import RecipeMethod
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
    # Why the trained model cannot become a plain checkpoint (export_merged); "" when it can.
    not_mergeable: str = ""
    # How it merges: (state, model) -> the stock architecture's state dict with the method's tensors folded in.
    # None: the model's own state dict already is one (biases and heads only).
    merge: Optional[Callable[[Any, nn.Module], Dict[str, Any]]] = None
    # Why a mixed-task batch (MultiTaskModel) cannot route this method's tasks per example; "" when it can
    # (additive biases and heads, routed as per-example bias deltas).
    not_batchable: str = ""
    # How a mixed-task batch routes the method's own tensors per example: (model, rows) -> a router, rows being per
    # task (then the stock model) {tensor name: tensor} of the method's tensors; the router has ``modules`` (the
    # wrapped modules it answers for: a bias there is routed on the wrapped base layer) and ``route(task_ids)``
    # (a context manager around the forward). Methods with the same router share it. None: biases and heads only.
    batch_router: Optional[Callable[[nn.Module, List[Dict[str, Any]]], Any]] = None
    # Which stored tensor names are the method's own (in modules it inserts: LoRA matrices, (IA)³ vectors,
    # AdapterBias shifts): name -> its role, None for a tensor of the stock architecture. The summary and the
    # card count them by role; the pre-load shape check expects them missing from a stock model.
    tensor_role: Optional[Callable[[str], Optional[str]]] = None
    # AdapterBank hooks for methods whose tensors live in peft layers: the modules an adapter's tensors need
    # wrapped (tensor names -> module names); wrap them in a shared model, turned off (model, modules,
    # method_config) -> the task's settings; turn the method's layers on for a task's settings, off elsewhere
    # (model, settings or None); the modules its layers wrap now (model -> names).
    bank_modules: Optional[Callable[[List[str]], List[str]]] = None
    bank_attach: Optional[Callable[[nn.Module, List[str], Dict[str, Any]], Any]] = None
    bank_switch: Optional[Callable[[nn.Module, Any], None]] = None
    bank_layers: Optional[Callable[[nn.Module], List[str]]] = None
    # PEFT export: "beft" (a plain bias selection: bitfit-hf writes a PEFT BEFT adapter), a callable
    # (stock model with the adapter applied, method config, modules to save whole (head, trained norms), task type)
    # -> a peft.PeftModel holding the method's part, or None (peft_refusal says why not). Trained biases of other
    # modules have no place beside a callable's tuner: the export refuses them by name.
    peft_export: Any = None
    peft_refusal: str = ""
    # The recipes' --method label of a config (``lora`` for BitFit + LoRA with no bias term); None: the name.
    label: Optional[Callable[[Any], Optional[str]]] = None
    # One line on what a config selects, for `bitfit-hf info` and the recipes' log; None: the bias terms.
    describe: Optional[Callable[[Any], str]] = None
    # The recipe flag of a config field where the method spells it its own way ({"bias_terms": "--match_bias_terms"}).
    flags: Tuple[Tuple[str, str], ...] = ()
    display_name: str = ""  # how model cards name the method ("AdapterBias")
    paper: str = ""  # "Title (venue): url", for model cards
    citation: str = ""  # BibTeX, for model cards
    # A variant of the method that a config describes, for model cards: the method's config ->
    # (display_name, description), or None for the method as registered.
    card_variant: Optional[Callable[[Any], Optional[Tuple[str, str]]]] = None
    # A term the trainer adds to the training loss: (model, state) -> a scalar tensor or None (AdapterBias's
    # l0_lambda times the expected L0 of its gates). None: the task loss alone.
    penalty: Optional[Callable[[nn.Module, Any], Any]] = None
    # What a saved adapter holds when it is not a training checkpoint: (method config, tensors) -> (the config it
    # loads with, its tensors). AdapterBias folds its L0 gates into L_alpha here. None: the tensors as trained.
    release: Optional[Callable[[Any, Dict[str, Any]], Tuple[Any, Dict[str, Any]]]] = None
    # The recipes' --method entries it answers to (``tuners/<method>/recipe.py``): each with its own flags (a dataclass
    # of HfArgumentParser fields) and how they become its config; (): the recipes do not offer it.
    recipe: Tuple[RecipeMethod, ...] = ()


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
    """The recipes' ``--method`` name of a method config or an adapter config: the method's ``label`` hook
    (``lora`` for BitFit + LoRA training no bias term, ``frozen`` / ``full`` for BitFit's head-only and full
    presets), else the registered method (``bitfit``, ``bitfit_lora``, ``adapterbias``, ``rand_uniform``, ...)."""
    method = getattr(config, "method", "bitfit") or "bitfit"
    spec = METHODS.get(method)
    label = spec.label(config) if spec is not None and spec.label is not None else None
    return label or method


def bias_terms_of(config: Any) -> List[str]:
    """``bias_terms`` of a method config or an adapter config, as a list."""
    terms = getattr(config, "bias_terms", None)
    return [terms] if isinstance(terms, str) else list(terms or [])


def recipe_methods() -> Dict[str, RecipeMethod]:
    """Every ``--method`` of the recipes, in registration order (``MethodSpec.recipe``)."""
    return {recipe.name: recipe for spec in METHODS.values() for recipe in spec.recipe}


def describe_method(config: Any) -> str:
    """One line on what a method config or an adapter config selects (``bitfit-hf info``, the recipes' log)."""
    method = getattr(config, "method", "bitfit") or "bitfit"
    spec = METHODS.get(method)
    if spec is not None and spec.describe is not None:
        return spec.describe(config)
    return f"{method_label(config)} ({' '.join(bias_terms_of(config))})"


def training_penalty(model: nn.Module, state: Any):
    """The method's term for the training loss after a training forward (MethodSpec.penalty), or None."""
    spec = METHODS.get(getattr(state.config, "method", "bitfit") or "bitfit")
    return spec.penalty(model, state) if spec is not None and spec.penalty is not None else None


def released(config: Any, tensors: Dict[str, Any]) -> Tuple[Any, Dict[str, Any]]:
    """``(config, tensors)`` of a saved adapter that is not a training checkpoint (MethodSpec.release)."""
    spec = METHODS.get(getattr(config, "method", "bitfit") or "bitfit")
    return spec.release(config, tensors) if spec is not None and spec.release is not None else (config, tensors)


def tensor_role_of(method: str, name: str) -> Optional[str]:
    """The role of a stored tensor that is ``method``'s own (in modules it inserts), else None."""
    spec = METHODS.get(method)
    return spec.tensor_role(name) if spec is not None and spec.tensor_role is not None else None


def config_from_dict(method: str, data: Dict[str, Any]):
    """A method config rebuilt from its serialised fields."""
    return method_spec(method).config_class.from_dict(data)


def _fields(config: Any) -> Dict[str, Any]:
    """A config's method-specific fields (an adapter config's ``method_config``)."""
    fields = getattr(config, "method_config", None)
    if fields is None:
        fields = {k: v for k, v in config.to_dict().items()
                  if k not in BitFitConfig.__dataclass_fields__ and not k.endswith("learning_rate")}
    return fields


def _settings(config: Any, skip: Tuple[str, ...] = ()) -> str:
    """``k=v`` of a config's method-specific fields."""
    return ", ".join(f"{k}={v}" for k, v in sorted(_fields(config).items()) if k not in skip)


def _adapterbias_describe(config: Any) -> str:
    fields = _fields(config)
    l0 = AdapterBiasConfig.describe_l0(fields)
    return f"adapterbias ({_settings(config, skip=('l0_lambda', 'l0_folded'))}" + (f"; {l0})" if l0 else ")")


def _bitfit_label(config: Any) -> Optional[str]:
    terms = bias_terms_of(config)
    return terms[0] if terms in (["frozen"], ["full"]) else None


def _terms(config: Any) -> str:
    patterns = getattr(config, "patterns", None)
    return " ".join(bias_terms_of(config) or ["all"]) + (f"; patterns {patterns}" if patterns else "")


register_method(MethodSpec("bitfit", BitFitConfig, apply_bitfit, "bias terms (all, presets, paper roles or patterns) + head",
                           peft_export="beft", label=_bitfit_label, recipe=bitfit_recipe.RECIPE))
_RANDOM_NOT_BATCHABLE = ("it trains entries of weight matrices, and mixed-task batches route biases and heads only")


def _random_role(name: str) -> Optional[str]:
    """The random baselines train entries of weight matrices (stored sparse): those are theirs."""
    return RANDOM if name.endswith(".weight") else None


def _random_describe(config: Any) -> str:
    seed = getattr(config, "random_seed", None)
    if seed is None:
        seed = (getattr(config, "method_config", None) or {}).get("random_seed")
    return (f"{config.method} (random weight entries, as many as bitfit {_terms(config)}"
            + (f"; random_seed {seed}" if seed is not None else "") + ")")


register_method(MethodSpec("rand_uniform", RandUniformConfig, apply_random_subset,
                           "baseline: as many random weight entries as a bias selection (uniform)",
                           not_batchable=_RANDOM_NOT_BATCHABLE, describe=_random_describe, tensor_role=_random_role,
                           flags=(("bias_terms", "--match_bias_terms"),), recipe=(random_recipe.RAND_UNIFORM,)))
register_method(MethodSpec("rand_row_col", RandRowColConfig, apply_random_subset,
                           "baseline: as many weight entries as a bias selection, in random whole rows/columns",
                           not_batchable=_RANDOM_NOT_BATCHABLE, describe=_random_describe, tensor_role=_random_role,
                           flags=(("bias_terms", "--match_bias_terms"),), recipe=(random_recipe.RAND_ROW_COL,)))
register_method(MethodSpec(
    "adapterbias", AdapterBiasConfig, apply_adapterbias,
    "a token-dependent shift L_alpha(h)*v on each FFN output projection, the FFN and embeddings LayerNorms "
    "(gain and bias) and the task head",
    prepare_base=insert_shifts,
    inserts_modules=True,
    display_name="AdapterBias",
    not_mergeable=("AdapterBias adds a token-dependent shift L_alpha(h)*v to each FFN output (its size depends on "
                   "each token's hidden state), which no bias or weight of the stock architecture can hold"),
    not_batchable=("AdapterBias adds a token-dependent shift L_alpha(h)*v to each FFN output (its size depends on "
                   "each token's hidden state), which no bias or weight of the stock architecture can hold, so it is "
                   "not a per-task bias delta"),
    tensor_role=adapterbias_tensor_role,
    describe=_adapterbias_describe,
    penalty=l0_penalty,
    release=release_adapter,
    recipe=adapterbias_recipe.RECIPE,
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
    if bias_terms_of(config) == ["frozen"]:
        return "LoRA", "peft LoRA matrices (default: query and value projections) + head, no bias term"
    return None


def _lora_describe(config: Any) -> str:
    if bias_terms_of(config) == ["frozen"]:
        return f"lora (LoRA, no bias term: stored as bitfit_lora with bias_terms frozen; {_settings(config)})"
    return f"bitfit_lora (bias terms {_terms(config)}; {_settings(config)})"


register_method(MethodSpec(
    "bitfit_lora", BitFitLoraConfig, apply_bitfit_lora,
    "bias terms + head, plus peft LoRA matrices (default: query and value projections)",
    inserts_modules=True, display_name="BitFit + LoRA", card_variant=_lora_card_variant,
    merge=lambda state, model: state.merged_state_dict(model),
    not_batchable=("its LoRA matrices change weights, not biases: mixed-task batches route per-example bias deltas "
                   "only. Serve BitFit + LoRA tasks one at a time with AdapterBank.activate(), from a bank of their own"),
    tensor_role=lambda name: LORA if is_lora_tensor(name) else None,
    bank_modules=lora_bank.bank_modules, bank_attach=lora_bank.bank_attach, bank_switch=lora_bank.bank_switch,
    bank_layers=lambda model: list(lora_bank.lora_layers(model)),
    peft_refusal=("its LoRA matrices: a PEFT adapter holds one tuner type, and BEFT (bias deltas) has no LoRA part. "
                  "Use bitfit-hf to load it, or `bitfit-hf merge` for a plain checkpoint"),
    label=lambda config: "lora" if bias_terms_of(config) == ["frozen"] else None,
    describe=_lora_describe,
    recipe=lora_recipe.RECIPE,
))


_IA3_CITATION = """@inproceedings{liu2022fewshot,
    title = "Few-Shot Parameter-Efficient Fine-Tuning is Better and Cheaper than In-Context Learning",
    author = "Liu, Haokun and Tam, Derek and Muqeeth, Mohammed and Mohta, Jay and Huang, Tenghao and Bansal, Mohit and Raffel, Colin",
    booktitle = "Advances in Neural Information Processing Systems",
    year = "2022",
    url = "https://arxiv.org/abs/2205.05638",
}"""


def _ia3_spec(name: str, config_class: type, description: str, display_name: str, recipe: RecipeMethod) -> MethodSpec:
    return MethodSpec(
        name, config_class, apply_bitfit_ia3, description, inserts_modules=True, display_name=display_name,
        paper="Few-Shot Parameter-Efficient Fine-Tuning is Better and Cheaper than In-Context Learning (Liu et al., "
              "NeurIPS 2022): https://arxiv.org/abs/2205.05638",
        citation=_IA3_CITATION,
        merge=lambda state, model: state.merged_state_dict(model),
        batch_router=ia3_layer.BatchRouter,  # per-example scaling vectors, as biases are per-example deltas
        tensor_role=lambda tensor: IA3 if is_ia3_tensor(tensor) else None,
        bank_modules=ia3_layer.bank_modules, bank_attach=ia3_bank_attach, bank_switch=ia3_layer.bank_switch,
        bank_layers=ia3_layer.bank_layers,
        peft_export=ia3_peft_model,
        describe=lambda config: f"{name} (bias terms {_terms(config)}; {_settings(config) or 'paper targets'})",
        recipe=(recipe,),
    )


register_method(_ia3_spec("ia3", IA3Config, "peft (IA)³ scaling vectors on keys, values and the FFN's inner activation "
                          "+ head, no bias term", "(IA)³", ia3_recipe.IA3_RECIPE))
register_method(_ia3_spec("bitfit_ia3", BitFitIA3Config, "bias terms + head, plus peft (IA)³ scaling vectors on keys, "
                          "values and the FFN's inner activation", "BitFit + (IA)³",
                          ia3_recipe.BITFIT_IA3_RECIPE))
