"""Resolve a :class:`BitFitConfig` against a model into the exact tensors to train.

Resolution never mutates the model: it returns a :class:`Selection` naming every trained tensor with
its role and layer, and the modules that still need a bias added. Anything that selects nothing is an
error that names the roles and the model's bias parameters, never a silent no-op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from torch import nn

from bitfit_hf.tuners.bitfit.config import BitFitConfig
from bitfit_hf.tuners.bitfit.layer import bias_kind, has_bias
from bitfit_hf.tuners.errors import SelectionError
from bitfit_hf.tuners.roles import ALL_ROLES, ARCHITECTURE_ROLES, PRESETS, match_role, roles_for
from bitfit_hf.utils.zero import full_numel, full_shape

HEAD = "head"
OTHER_BIAS = "bias"  # a bias parameter that no role names (e.g. ELECTRA's embeddings projection)
PATTERN = "pattern"
WEIGHT = "weight"  # full fine-tuning: a non-bias parameter


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

    config: BitFitConfig
    model_type: str
    entries: List[TrainedTensor]
    biases_to_add: Dict[str, str] = field(default_factory=dict)  # module name -> "native" | "hook"
    head_modules: List[str] = field(default_factory=list)
    total_params: int = 0  # parameters of the model before any bias is added

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
    usually tied to the input embeddings, and are never treated as a task head.
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
    return heads


def _under(name: str, modules: Iterable[str]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def _bias_names(params: Dict[str, nn.Parameter]) -> List[str]:
    return [n for n in params if n.rsplit(".", 1)[-1] == "bias"]


def _nothing_selected(what: str, model_type: str, params: Dict[str, nn.Parameter], hint: str = "") -> SelectionError:
    biases = _bias_names(params)
    shown = ", ".join(biases[:12]) + (f", ... ({len(biases)} in all)" if len(biases) > 12 else "")
    return SelectionError(
        f"{what} selects no parameter of this {model_type or 'model'} model. "
        f"Roles: {', '.join(ALL_ROLES)}; presets: {', '.join(PRESETS)}. "
        f"The model's bias parameters: {shown or 'none'}.{(' ' + hint) if hint else ''}"
    )


def resolve(model: nn.Module, config: Optional[BitFitConfig] = None) -> Selection:
    """Work out exactly which tensors ``config`` trains on ``model``."""
    config = config or BitFitConfig()
    model_type = getattr(getattr(model, "config", None), "model_type", "") or ""
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    head_modules = list(config.head_modules) if config.head_modules is not None else detect_head_modules(model)
    missing_heads = [m for m in head_modules if m not in modules]
    if missing_heads:
        raise SelectionError(f"head_modules {missing_heads} are not modules of this model.")
    head_params = [n for n in params if _under(n, head_modules)]

    entries: List[TrainedTensor] = []
    covered: Dict[str, None] = {}
    to_add: Dict[str, str] = {}

    def take(name: str, role: str, layer: str = "", chunk=None, added=False, numel=None) -> None:
        if numel is None:
            numel = full_numel(params[name]) if name in params else 0
            if chunk is not None:
                numel //= chunk[1]
        entries.append(TrainedTensor(name, role, layer, numel, chunk, added))
        covered[name] = None

    preset = config.preset
    if preset == "full":
        for name, param in params.items():
            if _under(name, head_modules):
                if config.train_head:
                    take(name, HEAD)
            else:
                take(name, OTHER_BIAS if name.endswith(".bias") else WEIGHT)
        return Selection(config, model_type, entries, {}, head_modules, sum(full_numel(p) for p in params.values()))

    if preset == "all":
        wanted_roles = list(roles_for(model_type)) if model_type in ARCHITECTURE_ROLES else []
    elif preset is not None:  # "frozen" and "paper-subset"
        wanted_roles = list(PRESETS[preset])
    else:
        wanted_roles = list(config.bias_terms)

    if wanted_roles:
        table = roles_for(model_type)
        for role in wanted_roles:
            if role not in table:
                if preset == "all":
                    continue
                raise _nothing_selected(
                    f"Role {role!r}",
                    model_type,
                    params,
                    f"This architecture has the roles: {', '.join(table)}.",
                )
            matched_any = False
            missing: List[str] = []
            for module_name, module in modules.items():
                if _under(module_name, head_modules):
                    continue
                for rule in table[role]:
                    layer = match_role(rule, module_name)
                    if layer is None:
                        continue
                    matched_any = True
                    bias_name = f"{module_name}.bias"
                    if has_bias(module):
                        take(bias_name, role, layer, rule.chunk)
                    elif config.add_missing_biases:
                        kind = to_add.get(module_name) or bias_kind(module)
                        to_add[module_name] = kind
                        size = module.out_features if isinstance(module, nn.Linear) else full_shape(module.weight)[0]
                        take(bias_name, role, layer, rule.chunk, added=True, numel=size)
                    else:
                        missing.append(module_name)
            if not matched_any and preset != "all":
                raise _nothing_selected(f"Role {role!r}", model_type, params)
            if missing and preset != "all":
                raise SelectionError(
                    f"Role {role!r} names {len(missing)} module(s) without a bias in this {model_type} model "
                    f"(e.g. {missing[0]}). Set add_missing_biases=True (--add_missing_biases) to add "
                    "zero-initialised biases there; the model's outputs stay unchanged until training."
                )

    if preset == "all":
        for name in _bias_names(params):
            if name not in covered and not _under(name, head_modules):
                take(name, OTHER_BIAS)
        if not entries:
            raise _nothing_selected(
                "bias_terms='all'",
                model_type,
                params,
                "This model has no bias terms: set add_missing_biases=True to add zero-initialised ones"
                + (" to every role's module." if model_type in ARCHITECTURE_ROLES else " (needs a known architecture)."),
            )

    for pattern in config.patterns:
        try:
            compiled = re.compile(pattern)
        except re.error as err:
            raise SelectionError(f"Invalid regular expression in patterns: {pattern!r} ({err}).") from None
        hits = [n for n in params if compiled.fullmatch(n)]
        if not hits:
            raise _nothing_selected(f"Pattern {pattern!r}", model_type, params, "Patterns must match whole names.")
        for name in hits:
            if name not in covered:
                take(name, PATTERN)

    if config.train_head:
        for name in head_params:
            if name not in covered:
                take(name, HEAD)

    if not entries:
        raise _nothing_selected(
            f"bias_terms={config.bias_terms}, patterns={config.patterns}, train_head={config.train_head}",
            model_type, params,
            "Nothing would be trained" + ("" if head_modules else " (the model has no task head)") + ": select bias terms, "
            "or keep train_head=True on a model with a task head.",
        )
    total = sum(full_numel(p) for p in params.values())
    return Selection(config, model_type, entries, to_add, head_modules, total)

