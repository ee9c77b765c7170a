"""Walk the network: BitFit's selection first (on the stock module names), then (IA)³ through peft.

As for BitFit + LoRA: BitFit resolves roles, adds biases and fingerprints the frozen base on the stock names;
peft then wraps the targets (``value`` becomes ``value.base_layer`` + ``value.ia3_l``); the selection is renamed
to the wrapped names and ``requires_grad`` set on exactly the vectors, the selected biases and the head.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from bitfit_hf.tuners.bias.model import apply_bitfit
from bitfit_hf.tuners.bitfit_ia3.config import IA3, BitFitIA3Config
from bitfit_hf.tuners.bitfit_ia3.layer import ia3_layers, ia3_module_of, inject_ia3, is_ia3_tensor, merged_tensors
from bitfit_hf.tuners.peft_layers import ADAPTER_NAME, merged_state_dict, select_with_branches
from bitfit_hf.tuners.roles import ARCHITECTURE_ROLES, match_role
from bitfit_hf.tuners.routes import Route
from bitfit_hf.tuners.state import (
    Selection,
    TunerState,
    detect_head_modules,
    get_tuner_state,
    set_tuner_state,
    unwrap,
)
from bitfit_hf.utils.names import is_under

OUTPUT_ROLES = ("b_k", "b_v")  # keys and values: their outputs are scaled
FEEDFORWARD_ROLES = ("b_m3",)  # the FFN output projection: its input (the FFN's inner activation) is scaled


class BitFitIA3State(TunerState):
    """:class:`TunerState` plus the (IA)³-wrapped module names (stock names)."""

    def __init__(self, selection: Selection, added_biases: Dict[str, str], fingerprint: str, ia3_modules: List[str]):
        super().__init__(selection, added_biases, fingerprint)
        self.ia3_modules = ia3_modules

    def merged_state_dict(self, model: nn.Module) -> Dict[str, torch.Tensor]:
        """The model's state dict in stock names with every vector folded into its base weight (and bias)."""
        model = unwrap(model)
        return merged_state_dict(model, ia3_layers(model), merged_tensors)


def _role_modules(model: nn.Module, roles, heads: List[str]) -> List[str]:
    model_type = getattr(getattr(model, "config", None), "model_type", "") or ""
    table = ARCHITECTURE_ROLES.get(model_type, {})
    return [name for name, module in model.named_modules()
            if name and not is_under(name, heads) and hasattr(module, "weight")
            and any(match_role(rule, name) is not None for role in roles for rule in table.get(role, []))]


def _matching(model: nn.Module, targets, heads: List[str]) -> List[str]:
    from peft import IA3Config
    from peft.tuners.tuners_utils import check_target_module_exists

    probe = IA3Config(target_modules=targets)
    return [name for name, _ in model.named_modules()
            if name and not is_under(name, heads) and bool(check_target_module_exists(probe, name))]


def resolve_targets(model: nn.Module, config, heads: List[str]) -> Tuple[List[str], List[str]]:
    """``(targets, feedforward targets)``: exact module names; errors naming the model's Linear layers."""
    model_type = getattr(getattr(model, "config", None), "model_type", "") or type(model).__name__
    if config.ia3_target_modules is None:
        targets = _role_modules(model, OUTPUT_ROLES + FEEDFORWARD_ROLES, heads)
        if not targets:
            raise ValueError(
                f"No default (IA)³ target for a {model_type!r} model (no key / value / FFN output role): set "
                "ia3_target_modules (--ia3_target_modules) and ia3_feedforward_modules."
            )
    else:
        targets = _matching(model, config.ia3_target_modules, heads)
        if not targets:
            linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)][:8]
            raise ValueError(f"ia3_target_modules={config.ia3_target_modules!r} matches no module of this model (outside "
                             f"the head {heads}). Its Linear layers include: {', '.join(linears)}.")
    if config.ia3_feedforward_modules is None:
        feedforward = set(_role_modules(model, FEEDFORWARD_ROLES, heads))
    else:
        feedforward = set(_matching(model, config.ia3_feedforward_modules, heads))
    return targets, [t for t in targets if t in feedforward]


def apply_bitfit_ia3(model: nn.Module, config: Optional[BitFitIA3Config] = None) -> BitFitIA3State:
    """Prepare ``model`` in place for BitFit + (IA)³ (or (IA)³ alone) and return the state (kept on the model)."""
    config = config or BitFitIA3Config()
    model = unwrap(model)
    previous = get_tuner_state(model)
    if ia3_layers(model):
        if isinstance(previous, BitFitIA3State) and previous.config == config:
            return previous
        raise ValueError("This model already carries (IA)³ layers: (IA)³ prepares a stock model once. Load a fresh "
                         "base model to use other settings (or to apply this adapter).")
    heads = list(config.head_modules) if config.head_modules is not None else detect_head_modules(model)
    targets, feedforward = resolve_targets(model, config, heads)

    bitfit = apply_bitfit(model, config)  # roles, added biases, fingerprint: all on the stock names
    inject_ia3(model, targets, feedforward)

    selection = select_with_branches(model, bitfit.selection, targets, IA3)
    state = BitFitIA3State(selection, dict(bitfit.added_biases), bitfit.fingerprint, targets)
    state.mask_handles = bitfit.mask_handles
    state.base_sketch = bitfit.base_sketch  # of the stock base, taken before peft wrapped its modules
    set_tuner_state(model, state)
    return state


def route(model: nn.Module, name: str, method_config: dict) -> Optional[Route]:
    """Method.route: an (IA)³ vector scales its module's output, or a feedforward target's input (resolved from the
    adapter's settings as at training time: the FFN output projection's role by default)."""
    if not is_ia3_tensor(name):
        return None
    module_name = ia3_module_of(name)
    chosen = method_config.get("ia3_feedforward_modules")
    if chosen is None:
        table = ARCHITECTURE_ROLES.get(getattr(getattr(model, "config", None), "model_type", "") or "", {})
        feedforward = any(match_role(rule, module_name) is not None for role in FEEDFORWARD_ROLES
                          for rule in table.get(role, []))
    else:
        from peft import IA3Config
        from peft.tuners.tuners_utils import check_target_module_exists

        feedforward = bool(check_target_module_exists(IA3Config(target_modules=chosen), module_name))
    return Route(module_name, "scale_in" if feedforward else "scale_out")


def peft_model(model: nn.Module, config, modules_to_save: List[str], task_type: Optional[str]):
    """Method.peft_model: ``model`` (a stock base with the adapter applied: (IA)³ layers, head, norms) as a
    plain ``peft`` IA3 model holding the same vectors, ``modules_to_save`` saved whole (the head, trained norms).

    bitfit-hf's (IA)³ layers are peft's own, so the export puts each wrapped module back, lets
    ``peft.get_peft_model`` wrap it again as a PeftModel's adapter, and copies the vectors: the loaded PEFT
    adapter computes exactly what the bitfit-hf one does. Changes ``model`` in place."""
    import peft

    model = unwrap(model)
    layers = ia3_layers(model)
    vectors = {name: layer.ia3_l[ADAPTER_NAME].detach().clone() for name, layer in layers.items()}
    feedforward = [name for name, layer in layers.items() if layer.is_feedforward]
    transposed = any(getattr(layer, "fan_in_fan_out", False) for layer in layers.values())
    for name, layer in layers.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, layer.get_base_layer())
    if hasattr(model, "peft_config"):  # left by inject_adapter_in_model; get_peft_model starts afresh
        del model.peft_config
    peft_config = peft.IA3Config(task_type=task_type, target_modules=list(vectors), feedforward_modules=feedforward,
                                 modules_to_save=list(modules_to_save) or None, fan_in_fan_out=transposed)
    wrapped = peft.get_peft_model(model, peft_config)
    inner = wrapped.get_base_model()
    with torch.no_grad():
        for name, vector in vectors.items():
            target = inner.get_submodule(name).ia3_l[wrapped.active_adapter]
            target.copy_(vector.to(target.dtype))
    return wrapped
