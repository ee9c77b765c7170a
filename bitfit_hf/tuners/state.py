"""What every method shares: the resolved selection of trained tensors, the state a method leaves on
the model, and where it is kept.

A method's ``apply(model, config)`` returns a :class:`TunerState` (its ``selection`` names every trained
tensor with its role and layer) and stores it with :func:`set_tuner_state`; the trainer, the adapter
format and the reports read it back with :func:`get_tuner_state`, whatever the method.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from bitfit_hf.tuners.roles import HEAD  # noqa: F401 - the head role, read from here by the methods
from bitfit_hf.tuners.summary import TrainableSummary
from bitfit_hf.utils.names import is_under
from bitfit_hf.utils.sentence_pooling import untrained_modules


@dataclass(frozen=True)
class TrainedTensor:
    """One trained parameter (or one fused chunk of it) and why it is trained."""

    name: str
    role: str
    layer: str = ""
    numel: int = 0
    chunk: Optional[Tuple[int, int]] = None
    added: bool = False


@dataclass
class Selection:
    """The resolved plan: trained tensors, biases to add, and the model's size for fractions."""

    config: Any  # the method's config (BitFitConfig, AdapterBiasConfig, ...)
    model_type: str
    entries: List[TrainedTensor]
    biases_to_add: Dict[str, str] = field(default_factory=dict)  # module name -> "native" | "hook"
    head_modules: List[str] = field(default_factory=list)
    total_params: int = 0  # parameters of the model before any bias is added
    layer_counts: Dict[str, int] = field(default_factory=dict)  # stack ("" or "encoder"/"decoder") -> layers

    @property
    def parameter_names(self) -> List[str]:
        """Trained parameter names, each once, in model order."""
        return list(dict.fromkeys(entry.name for entry in self.entries))

    @property
    def head_parameter_names(self) -> List[str]:
        return list(dict.fromkeys(e.name for e in self.entries if e.role == HEAD))

    @property
    def bias_parameter_names(self) -> List[str]:
        return list(dict.fromkeys(e.name for e in self.entries if e.role != HEAD))

    @property
    def trainable_numel(self) -> int:
        return sum(entry.numel for entry in self.entries)

    def chunk_masks(self) -> Dict[str, List[Tuple[int, int]]]:
        """Parameters trained only in some fused chunks: ``{name: [(index, count), ...]}``."""
        chunks: Dict[str, List[Optional[Tuple[int, int]]]] = {}
        for entry in self.entries:
            chunks.setdefault(entry.name, []).append(entry.chunk)
        return {
            name: sorted(set(parts))
            for name, parts in chunks.items()
            if None not in parts and len(set(parts)) < parts[0][1]
        }


def detect_head_modules(model: nn.Module) -> List[str]:
    """Top-level modules outside the base model that own parameters: the task head.

    ``BertForSequenceClassification`` gives ``["classifier"]``, DistilBERT ``["pre_classifier",
    "classifier"]``, GPT-2 and LLaMA ``["score"]``. Output embeddings (an LM head) are pretrained,
    usually tied to the input embeddings, and are never treated as a task head. Modules of the base
    recorded as never trained (:func:`~bitfit_hf.utils.sentence_pooling.mark_untrained_modules`: a
    sentence-transformers checkpoint's pooler, modules the load initialised) belong to the head too.
    """
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else None
    if not isinstance(base, nn.Module) or base is model:
        return []
    output_embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    heads = []
    for name, child in model.named_children():
        if name == prefix or child is output_embeddings:
            continue
        if any(True for _ in child.parameters()):
            heads.append(name)
    return heads + [name for name in untrained_modules(model) if name not in heads]


STATE_ATTR = "_bitfit_state"  # the attribute of the (unwrapped) model that holds its TunerState


class TunerState:
    """What a method's ``apply`` did to a model; kept on the model (:func:`set_tuner_state`)."""

    def __init__(self, selection: Selection, added_biases: Dict[str, str], fingerprint: str):
        self.selection = selection
        self.added_biases = added_biases  # module name -> "native" | "hook"
        self.fingerprint = fingerprint  # of the frozen base weights, taken before training
        self.mask_handles: List = []
        # names, shapes and sampled weights of the base: recognises it loaded another way (quantized or not)
        self.base_sketch: Dict[str, Any] = {}

    @property
    def config(self):
        return self.selection.config

    @property
    def summary(self) -> TrainableSummary:
        return TrainableSummary.from_selection(self.selection)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DDP / DeepSpeed / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def get_tuner_state(model: nn.Module) -> Optional[TunerState]:
    """The state of whichever method prepared ``model``, or ``None``."""
    return getattr(unwrap(model), STATE_ATTR, None)


def set_tuner_state(model: nn.Module, state: TunerState) -> None:
    setattr(unwrap(model), STATE_ATTR, state)


def get_bitfit_state(model: nn.Module) -> Optional[TunerState]:
    """Deprecated alias of :func:`get_tuner_state`."""
    warnings.warn("get_bitfit_state is deprecated: use get_tuner_state (the state of whichever method prepared the "
                  "model).", FutureWarning, stacklevel=2)
    return get_tuner_state(model)


def trainable_state_dict(model: nn.Module) -> Dict[str, torch.Tensor]:
    """The tensors an adapter carries: every selected tensor plus the head, detached, on CPU."""
    state = get_tuner_state(model)
    if state is None:
        raise ValueError("This model was not prepared with a bitfit-hf method (apply_method / apply_bitfit); there is no selection to save.")
    params = dict(unwrap(model).named_parameters())
    return {name: params[name].detach().to("cpu").contiguous() for name in adapter_parameter_names(model, state)}


def adapter_parameter_names(model: nn.Module, state: TunerState) -> List[str]:
    """Trained tensors plus the whole head: the head travels with the adapter even when frozen,
    because a stock model's head is randomly initialised."""
    heads = state.selection.head_modules
    head = [n for n, _ in unwrap(model).named_parameters() if is_under(n, heads)]
    return list(dict.fromkeys(state.selection.parameter_names + head))
