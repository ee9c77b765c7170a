"""The method registry: :class:`Method`, the base a method folder subclasses, and the functions that find a method.

A method folder (``tuners/<method>/``) holds its config, how it changes a module and walks a network, its recipe
flags, and a ``method.py`` whose :class:`Method` subclass says what it is (name, config class, card prose) and
overrides the hooks it supports; the folder's ``__init__.py`` registers it (:func:`register_method`). Everything above
the tuners (trainer, adapter format, bank, serving, cards, recipes) asks the registry, never a method folder.

A hook a method does not override either does the plain thing (no modules to insert, a model whose own state dict is
the merged checkpoint, no tensors of its own) or raises :class:`NotSupported` with the method's reason.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

from torch import nn

from bitfit_hf.tuners.bias.config import BitFitConfig
from bitfit_hf.tuners.recipe import RecipeMethod
from bitfit_hf.tuners.state import TunerState
from bitfit_hf.utils.modes import inserted_modules_follow


class NotSupported(ValueError):
    """A method does not support a hook; the message is its reason, a clause that completes "cannot ...: "."""


class Method:
    """A registered method. Subclasses set the class attributes and override the hooks they support.

    Attributes:
        name: the registry name, stored in adapters (``config_class.method``).
        config_class: its config (a dataclass with ``method``, ``to_dict`` / ``from_dict``, ``learning_rate_for``).
        description: what it trains, for model cards and PEFT refusals ("bias terms + head, plus ...").
        display_name: how model cards name it ("AdapterBias"); "" keeps BitFit's card.
        paper, citation: "Title (venue): url" and BibTeX, for model cards.
        recipe: the recipes' ``--method`` entries it answers to (``tuners/<method>/recipe.py``); (): none.
        flags: ``(config field, recipe flag)`` where the method spells a field's flag its own way.
        inserts_modules: its tensors live in modules a stock model lacks until :meth:`prepare_base` (LoRA branches):
            an adapter's names missing from a stock model are expected there, not damage.
        not_mergeable: why the trained model cannot become a plain checkpoint; "" when it can.
        not_batchable: why a mixed-task batch cannot route its tasks per example; "" when every tensor it stores has a
            route (:meth:`route`, or a stock module bias or norm gain).
        peft_refusal: why it has no PEFT export, where it has none.
        beft_export: a plain bias selection: bitfit-hf writes it as a PEFT BEFT adapter.
    """

    name: str = ""
    config_class: Optional[type] = None
    description: str = ""
    display_name: str = ""
    paper: str = ""
    citation: str = ""
    recipe: Tuple[RecipeMethod, ...] = ()
    flags: Tuple[Tuple[str, str], ...] = ()
    inserts_modules: bool = False
    not_mergeable: str = ""
    not_batchable: str = ""
    peft_refusal: str = ""
    beft_export: bool = False

    def supports(self, hook: str) -> bool:
        """Whether the method overrides ``hook`` (a method of this class)."""
        return hook in vars(self) or getattr(type(self), hook) is not getattr(Method, hook)

    # ---- training -------------------------------------------------------------------------------------------
    def apply(self, model: nn.Module, config: Any) -> TunerState:
        """Prepare ``model`` in place for ``config`` and return the state kept on it (``set_tuner_state``)."""
        raise NotImplementedError(f"method {self.name!r} does not define apply()")

    def penalty(self, model: nn.Module, state: Any):
        """A term the trainer adds to the training loss after a training forward; None: the task loss alone."""
        return None

    def release(self, config: Any, tensors: Dict[str, Any]) -> Tuple[Any, Dict[str, Any]]:
        """What a saved adapter holds when it is not a training checkpoint: ``(config, tensors)`` as trained."""
        return config, tensors

    # ---- loading and merging --------------------------------------------------------------------------------
    def prepare_base(self, model: nn.Module, config: Any) -> None:
        """Insert the modules an adapter's tensors live in, idempotently, before they load into a stock model."""

    def tensor_role(self, name: str) -> Optional[str]:
        """The role of a stored tensor that is the method's own (in modules it inserts); None for a stock tensor."""
        return None

    def merge(self, state: Any, model: nn.Module) -> Optional[Dict[str, Any]]:
        """The stock architecture's state dict with the method's tensors folded in; None: the model's own state dict
        already is one (biases and heads only)."""
        if self.not_mergeable:
            raise NotSupported(self.not_mergeable)
        return None

    # ---- serving many tasks ---------------------------------------------------------------------------------
    def route(self, model: nn.Module, name: str, method_config: Dict[str, Any]):
        """Where a stored tensor of the method's own acts in a mixed batch: a
        :class:`~bitfit_hf.adapters.routing.Route` (module, kind of change, slot), or None for a stock tensor
        (module biases and norm gains route without the method) or one the method cannot route."""
        return None

    # ---- export ---------------------------------------------------------------------------------------------
    def peft_model(self, model: nn.Module, config: Any, modules_to_save: List[str], task_type: Optional[str]):
        """``model`` (a stock base with the adapter applied) as a ``peft.PeftModel`` holding the method's own tuner,
        the head and trained norms in ``modules_to_save``."""
        raise NotSupported(self.peft_refusal or f"{self.name} has no PEFT tuner of its own")

    # ---- words ----------------------------------------------------------------------------------------------
    def label(self, config: Any) -> Optional[str]:
        """The recipes' ``--method`` name of a config where it is not the method's name (``lora``)."""
        return None

    def describe(self, config: Any) -> str:
        """One line on what a config selects, for ``bitfit-hf info`` and the recipes' log: its bias terms where
        it has them, else its own settings."""
        words = " ".join(bias_terms_of(config)) or method_settings(config)
        return f"{method_label(config)} ({words})" if words else method_label(config)

    def card_variant(self, config: Any) -> Optional[Tuple[str, str]]:
        """``(display_name, description)`` of the variant a config describes, for model cards; None: as registered."""
        return None

    def __repr__(self) -> str:
        return f"<method {self.name!r} ({type(self).__module__}.{type(self).__qualname__})>"


METHODS: Dict[str, Method] = {}
#: Hooks of earlier releases that the layer-level routing replaced (Method.route).
RETIRED_HOOKS = ("batch_router", "bank_modules", "bank_attach", "bank_switch", "bank_layers")


def register_method(method: Any) -> Method:
    """Register a :class:`Method` (an instance or a subclass); returns the registered instance.

    A name already registered is refused, as PEFT's ``register_peft_method`` does: adapters store only the name, so
    a silent replacement would load every adapter of the old method with the new one's hooks. To replace a method
    on purpose, :func:`unregister_method` it first."""
    if isinstance(method, type):
        method = method()
    if not isinstance(method, Method):
        raise TypeError(f"register_method takes a Method, not {type(method).__name__}")
    if not method.name:
        raise ValueError(f"{type(method).__name__} has no name")
    retired = [hook for hook in RETIRED_HOOKS if hasattr(method, hook)]
    if retired:
        warnings.warn(f"{type(method).__qualname__} defines {', '.join(retired)}, which bitfit-hf no longer calls: "
                      "AdapterBank, MultiTaskModel and the server reach a method's own tensors through route() "
                      "(a Route per stored tensor; see docs/adding-a-method.md).", FutureWarning, stacklevel=2)
    existing = METHODS.get(method.name)
    if existing is not None:
        raise ValueError(f"A method named {method.name!r} is already registered: {existing!r}. Give "
                         f"{type(method).__qualname__} another name, or call unregister_method({method.name!r}) "
                         "first to replace it.")
    METHODS[method.name] = method
    return method


def unregister_method(name: str) -> None:
    """Forget a registered method (a test's toy method)."""
    METHODS.pop(name, None)


def method_spec(name: str) -> Method:
    """The registered method ``name``; a clear error naming the known ones otherwise."""
    if name not in METHODS:
        raise ValueError(f"Unknown method {name!r}: this version of bitfit-hf knows {', '.join(sorted(METHODS))}. "
                         "An adapter written by a newer version needs that version.")
    return METHODS[name]


def _method_of(config: Any) -> Optional[Method]:
    return METHODS.get(getattr(config, "method", "bitfit") or "bitfit")


def apply_method(model: nn.Module, config: Optional[Any] = None) -> TunerState:
    """Prepare ``model`` in place for the method of ``config`` (default: BitFit on all biases). Modules the
    method inserts take the model's mode (no LoRA dropout in a model in eval mode)."""
    config = config if config is not None else BitFitConfig()
    method = method_spec(getattr(config, "method", "bitfit"))
    with inserted_modules_follow(model):
        return method.apply(model, config)


def method_label(config: Any) -> str:
    """The recipes' ``--method`` name of a method config or an adapter config: the method's :meth:`Method.label`
    (``lora`` for BitFit + LoRA training no bias term, ``frozen`` / ``full`` for BitFit's presets), else its name."""
    name = getattr(config, "method", "bitfit") or "bitfit"
    method = METHODS.get(name)
    return (method.label(config) if method is not None else None) or name


def bias_terms_of(config: Any) -> List[str]:
    """``bias_terms`` of a method config or an adapter config, as a list; empty for a method without a bias
    selection (AdapterBias)."""
    terms = getattr(config, "bias_terms", None)
    return [terms] if isinstance(terms, str) else list(terms or [])


def recipe_methods() -> Dict[str, RecipeMethod]:
    """Every ``--method`` of the recipes, in registration order (:attr:`Method.recipe`)."""
    return {recipe.name: recipe for method in METHODS.values() for recipe in method.recipe}


def describe_method(config: Any) -> str:
    """One line on what a method config or an adapter config selects (``bitfit-hf info``, the recipes' log)."""
    method = _method_of(config)
    return (method or Method()).describe(config)


def training_penalty(model: nn.Module, state: Any):
    """The method's term for the training loss after a training forward (:meth:`Method.penalty`), or None."""
    method = _method_of(state.config)
    return method.penalty(model, state) if method is not None else None


def released(config: Any, tensors: Dict[str, Any]) -> Tuple[Any, Dict[str, Any]]:
    """``(config, tensors)`` of a saved adapter that is not a training checkpoint (:meth:`Method.release`)."""
    method = _method_of(config)
    return method.release(config, tensors) if method is not None else (config, tensors)


def tensor_role_of(method: str, name: str) -> Optional[str]:
    """The role of a stored tensor that is ``method``'s own (in modules it inserts), else None."""
    found = METHODS.get(method)
    return found.tensor_role(name) if found is not None else None


def config_from_dict(method: str, data: Dict[str, Any]):
    """A method config rebuilt from its serialised fields."""
    return method_spec(method).config_class.from_dict(data)


# ---- what method folders share in their prose ------------------------------------------------------------------
def method_fields(config: Any) -> Dict[str, Any]:
    """A config's method-specific fields (an adapter config's ``method_config``, or a method config's own fields)."""
    fields = getattr(config, "method_config", None)
    if fields is None:
        fields = {k: v for k, v in config.to_dict().items()
                  if k not in BitFitConfig.__dataclass_fields__ and not k.endswith("learning_rate")}
    return fields


def method_settings(config: Any, skip: Tuple[str, ...] = ()) -> str:
    """``k=v, ...`` of a config's method-specific fields."""
    return ", ".join(f"{k}={v}" for k, v in sorted(method_fields(config).items()) if k not in skip)


def selection_words(config: Any) -> str:
    """A bias selection in words: its terms (``all`` by default) and its patterns."""
    patterns = getattr(config, "patterns", None)
    return " ".join(bias_terms_of(config) or ["all"]) + (f"; patterns {patterns}" if patterns else "")


_SPEC_HOOKS = ("prepare_base", "merge", "route", "tensor_role", "label", "describe", "card_variant", "penalty", "release")


def MethodSpec(name: str, config_class: type, apply, description: str = "", **fields) -> Method:  # noqa: N802
    """Deprecated: a :class:`Method` from keyword fields (hooks as plain callables). Subclass :class:`Method`."""
    warnings.warn("MethodSpec is deprecated: subclass bitfit_hf.tuners.registry.Method and register an instance.",
                  FutureWarning, stacklevel=2)
    method = Method()
    method.name, method.config_class, method.description = name, config_class, description
    method.apply = apply
    peft_export = fields.pop("peft_export", None)
    if peft_export == "beft":
        method.beft_export = True
    elif callable(peft_export):
        method.peft_model = peft_export
    for key, value in fields.items():
        if key in _SPEC_HOOKS:
            if value is not None:
                setattr(method, key, value)
        elif hasattr(Method, key):
            setattr(method, key, value)
        else:
            raise TypeError(f"MethodSpec got an unknown field {key!r}")
    return method
