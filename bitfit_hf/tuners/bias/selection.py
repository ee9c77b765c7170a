"""Resolve a :class:`BitFitConfig` against a model into the exact tensors to train.

Resolution never mutates the model: it returns a :class:`Selection` naming every trained tensor with
its role and layer, and the modules that still need a bias added. Anything that selects nothing is an
error that names the roles and the model's bias parameters, never a silent no-op; only a role in a list
of several (or a preset) may be one the model lacks, and is then skipped.
"""

from __future__ import annotations

import logging
import re
from typing import Dict, Iterable, List, Optional

from torch import nn

from bitfit_hf.tuners.bias.config import BitFitConfig
from bitfit_hf.tuners.bias.layer import bias_kind, has_bias
from bitfit_hf.tuners.errors import SelectionError
from bitfit_hf.tuners.roles import (
    ALL_ROLES,
    ARCHITECTURE_ROLES,
    GAIN_ROLES,
    PRESETS,
    match_role,
    module_roles,
    parameter_of,
    roles_for,
    rules_of,
)
from bitfit_hf.tuners.state import HEAD, Selection, TrainedTensor, detect_head_modules
from bitfit_hf.utils.names import is_under
from bitfit_hf.utils.zero import full_numel, full_shape

OTHER_BIAS = "bias"  # a bias parameter that no role names (e.g. ELECTRA's embeddings projection)
PATTERN = "pattern"
WEIGHT = "weight"  # full fine-tuning: a non-bias parameter
GAIN = "gain"  # a norm gain that no gain role names (e.g. Qwen3's per-head q_norm / k_norm)
EMBEDDING_ROLES = ("b_emb_LN", "g_emb_LN")  # below the first layer: the deepest for layer-wise rates

logger = logging.getLogger("bitfit_hf")


def layer_depths(selection: Selection) -> Dict[str, int]:
    """How many layers below the top each trained tensor sits (0: the top layer, the head, the pooler
    and final norms; ``L`` for the embeddings' norm of an ``L``-layer stack). Layer-wise learning rates
    scale a tensor's rate by ``decay ** depth``; tensors outside every layer that are not embeddings get 0."""
    counts = selection.layer_counts
    deepest = max(counts.values(), default=0)
    depths: Dict[str, int] = {}
    for entry in selection.entries:
        stack, _, index = entry.layer.rpartition(".")
        if index.isdigit() and stack in counts:
            depth = counts[stack] - 1 - int(index)
        elif entry.role in EMBEDDING_ROLES:
            depth = deepest
        else:
            depth = 0
        depths[entry.name] = max(depths.get(entry.name, 0), depth)
    return depths


def count_layers(model_type: str, module_names: Iterable[str]) -> Dict[str, int]:
    """Layers per stack of a known architecture, from the module names its role rules match."""
    if model_type not in ARCHITECTURE_ROLES:
        return {}
    counts: Dict[str, int] = {}
    rules = [rule for role_rules in roles_for(model_type).values() for rule in role_rules]
    for name in module_names:
        for rule in rules:
            layer = match_role(rule, name)
            if layer:
                stack, _, index = layer.rpartition(".")
                counts[stack] = max(counts.get(stack, 0), int(index) + 1)
                break
    return counts


def is_norm(module: nn.Module) -> bool:
    """A LayerNorm / RMSNorm-style module with a 1-D gain (``weight``)."""
    weight = getattr(module, "weight", None)
    return (isinstance(module, nn.LayerNorm) or "norm" in type(module).__name__.lower()) and (
        isinstance(weight, nn.Parameter) and weight.dim() == 1)


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


class _Plan:
    """The selection being built: entries in order, the names covered, the biases to add."""

    def __init__(self, config: BitFitConfig, model: nn.Module):
        self.config = config
        self.model_type = getattr(getattr(model, "config", None), "model_type", "") or ""
        self.modules = dict(model.named_modules())
        self.params = dict(model.named_parameters())
        heads = list(config.head_modules) if config.head_modules is not None else detect_head_modules(model)
        missing = [m for m in heads if m not in self.modules]
        if missing:
            raise SelectionError(f"head_modules {missing} are not modules of this model.")
        self.head_modules = heads
        self.entries: List[TrainedTensor] = []
        self.covered: Dict[str, None] = {}
        self.to_add: Dict[str, str] = {}

    def take(self, name: str, role: str, layer: str = "", chunk=None, added=False, numel=None) -> None:
        if numel is None:
            numel = full_numel(self.params[name]) if name in self.params else 0
            if chunk is not None:
                numel //= chunk[1]
        self.entries.append(TrainedTensor(name, role, layer, numel, chunk, added))
        self.covered[name] = None

    def nothing_selected(self, what: str, hint: str = "") -> ValueError:
        return _nothing_selected(what, self.model_type, self.params, hint)

    def selection(self) -> Selection:
        total = sum(full_numel(p) for p in self.params.values())
        return Selection(self.config, self.model_type, self.entries, self.to_add, self.head_modules, total,
                         count_layers(self.model_type, self.modules))

    @property
    def whole_model_preset(self) -> bool:
        """``all`` / ``one-d``: every role the architecture has, skipping those it lacks silently."""
        return self.config.preset in ("all", "one-d")


def resolve(model: nn.Module, config: Optional[BitFitConfig] = None) -> Selection:
    """Work out exactly which tensors ``config`` trains on ``model``."""
    plan = _Plan(config or BitFitConfig(), model)
    if plan.config.preset == "full":
        _select_everything(plan)
        return plan.selection()
    _select_roles(plan, _wanted_roles(plan))
    if plan.whole_model_preset:
        _select_unnamed_vectors(plan)
    _select_patterns(plan)
    if plan.config.train_head:
        for name in plan.params:
            if is_under(name, plan.head_modules) and name not in plan.covered:
                plan.take(name, HEAD)
    if not plan.entries and not plan.config.trains_more:
        cfg = plan.config
        raise plan.nothing_selected(
            f"bias_terms={cfg.bias_terms}, patterns={cfg.patterns}, train_head={cfg.train_head}",
            "Nothing would be trained" + ("" if plan.head_modules else " (the model has no task head)")
            + ": select bias terms, or keep train_head=True on a model with a task head.",
        )
    return plan.selection()


def _wanted_roles(plan: _Plan) -> List[str]:
    preset = plan.config.preset
    if plan.whole_model_preset:
        roles = list(roles_for(plan.model_type)) if plan.model_type in ARCHITECTURE_ROLES else []
        return roles + list(GAIN_ROLES) if preset == "one-d" else roles
    if preset is not None:  # "frozen" and "paper-subset"
        return list(PRESETS[preset])
    return list(plan.config.bias_terms)


def _select_everything(plan: _Plan) -> None:
    """``full``: every parameter (the full fine-tuning baseline)."""
    for name in plan.params:
        if is_under(name, plan.head_modules):
            if plan.config.train_head:
                plan.take(name, HEAD)
        else:
            plan.take(name, OTHER_BIAS if name.endswith(".bias") else WEIGHT)


def _select_roles(plan: _Plan, roles: List[str]) -> None:
    """The tensors of the named roles. A role the model lacks (no module of it in this architecture, or, with
    nothing to add, no bias on any of its modules) is skipped under ``all`` / ``one-d`` and in a list of several
    roles, so one list serves every architecture (GPT-2 has no ``b_emb_LN``, BERT no ``b_final_LN``, LLaMA's
    norms no bias); a single role the model lacks, or a list of which it has none, is an error naming the roles
    it has (or the modules without a bias). A role only some of whose modules lack a bias is an error too."""
    if not roles:
        return
    lenient = plan.whole_model_preset
    table = roles_for(plan.model_type)
    matched: Dict[str, List[str]] = {role: [] for role in roles}
    missing: Dict[str, List[str]] = {role: [] for role in roles}
    body = {name: module for name, module in plan.modules.items() if not is_under(name, plan.head_modules)}
    # role-major: the order adapters record their tensors in
    for role in (r for r in roles if rules_of(table, r) is not None):
        take = _take_gain if parameter_of(role) == "weight" else _take_bias
        for module_name, module in body.items():
            for _, rule, layer in module_roles(table, module_name, [role]):
                matched[role].append(module_name)
                take(plan, module_name, module, role, layer, rule.chunk, missing[role])
    if lenient:
        return
    # A role the model lacks: no module of it, or (nothing added) none of its modules has a bias.
    lacking = [role for role in roles if len(missing[role]) == len(matched[role])]
    if len(lacking) == len(roles):
        unbiased = next((role for role in roles if missing[role]), None)
        if unbiased is None:
            what = f"Role {roles[0]!r}" if len(roles) == 1 else f"bias_terms {' '.join(roles)}"
            raise plan.nothing_selected(what, "This architecture has the roles: "
                                              f"{', '.join(_roles_present(table, body))}.")
        raise _no_bias_there(plan, unbiased, missing[unbiased])
    if lacking:
        logger.info("bias_terms: skipping %s, which this %s model lacks.", ", ".join(lacking), plan.model_type)
    for role in roles:
        if missing[role] and role not in lacking:
            raise _no_bias_there(plan, role, missing[role])


def _no_bias_there(plan: _Plan, role: str, modules: List[str]) -> SelectionError:
    return SelectionError(
        f"Role {role!r} names {len(modules)} module(s) without a bias in this {plan.model_type} model "
        f"(e.g. {modules[0]}). Set add_missing_biases=True (--add_missing_biases) to add "
        "zero-initialised biases there; the model's outputs stay unchanged until training."
    )


def _roles_present(table: Dict, body: Dict[str, nn.Module]) -> List[str]:
    """The roles whose modules this model has (a gain role where its norm has a 1-D gain), in table order."""
    present: Dict[str, None] = {}
    for module_name, module in body.items():
        for role, _, _ in module_roles(table, module_name, list(table) + list(GAIN_ROLES)):
            if parameter_of(role) == "bias" or is_norm(module):
                present[role] = None
    order = list(table) + list(GAIN_ROLES)
    return sorted(present, key=order.index)


def _take_bias(plan: _Plan, module_name: str, module: nn.Module, role: str, layer: str, chunk, missing: List[str]) -> None:
    """The module's bias, or a bias to add (``add_missing_biases``), or a note that it has none."""
    bias_name = f"{module_name}.bias"
    if has_bias(module):
        plan.take(bias_name, role, layer, chunk)
    elif plan.config.add_missing_biases:
        plan.to_add[module_name] = plan.to_add.get(module_name) or bias_kind(module)
        size = module.out_features if isinstance(module, nn.Linear) else full_shape(module.weight)[0]
        plan.take(bias_name, role, layer, chunk, added=True, numel=size)
    else:
        missing.append(module_name)


def _take_gain(plan: _Plan, module_name: str, module: nn.Module, role: str, layer: str, chunk, missing: List[str]) -> None:
    """A norm's 1-D gain (gain roles of ``one-d``): never added; named explicitly, it must exist."""
    if is_norm(module):
        plan.take(f"{module_name}.weight", role, layer)
    elif plan.config.preset is None:
        raise SelectionError(f"Role {role!r} names {module_name}, which has no 1-D gain (weight).")


def _select_unnamed_vectors(plan: _Plan) -> None:
    """``all`` / ``one-d``: biases (and for ``one-d`` norm gains) no role names too (ELECTRA's embeddings
    projection, Qwen3's q_norm, ...); an error if nothing at all is selected."""
    for name in _bias_names(plan.params):
        if name not in plan.covered and not is_under(name, plan.head_modules):
            plan.take(name, OTHER_BIAS)
    if plan.config.preset == "one-d":
        for module_name, module in plan.modules.items():
            gain = f"{module_name}.weight"
            if is_norm(module) and gain in plan.params and gain not in plan.covered and not is_under(module_name, plan.head_modules):
                plan.take(gain, GAIN)
    if not plan.entries:
        known = plan.model_type in ARCHITECTURE_ROLES
        raise plan.nothing_selected(
            f"bias_terms={plan.config.preset!r}",
            "This model has no bias terms: set add_missing_biases=True (--add_missing_biases in the recipes) to "
            "add zero-initialised ones" + (" to every role's module." if known else " (needs a known architecture)."),
        )


def _select_patterns(plan: _Plan) -> None:
    for pattern in plan.config.patterns:
        try:
            compiled = re.compile(pattern)
        except re.error as err:
            raise SelectionError(f"Invalid regular expression in patterns: {pattern!r} ({err}).") from None
        hits = [n for n in plan.params if compiled.fullmatch(n)]
        if not hits:
            raise plan.nothing_selected(f"Pattern {pattern!r}", "Patterns must match whole names.")
        for name in hits:
            if name not in plan.covered:
                plan.take(name, PATTERN)
