"""How far each bias type moved in each layer: the BitFit paper's Figure 1.

For every trained bias vector ``b`` the change is ``(1/dim b)·‖b₀ − b_F‖₁``: the mean absolute
difference between the base model's bias (``b₀``; zero for a bias that bitfit-hf added) and the
fine-tuned one (``b_F``). The matrix has one row per bias type (``b_q``, ``b_m2``, ...) and one column
per layer, plus an average column; rows are sorted by their total change, as in the paper.

The base biases come from the base model (a module, a state dict, or the base checkpoint's
safetensors files, reading only the bias tensors), or from a snapshot taken before training
(:func:`snapshot_biases`, which :class:`~bitfit_hf.BitFitTrainer` takes at construction).
The result is stored as ``bias_change.json`` beside the adapter so a model card can be built later,
and rendered to ``bias_change.png`` with matplotlib (Agg, no display needed).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from bitfit_hf.adapters.base_checkpoint import read_checkpoint_biases
from bitfit_hf.adapters.config import AdapterConfig
from bitfit_hf.adapters.sparse import tensor_names
from bitfit_hf.tuners import tensor_role_of
from bitfit_hf.tuners.peft_layers import BASE_LAYER
from bitfit_hf.tuners.roles import ARCHITECTURE_ROLES, GAIN_ROLES, PRESETS, module_roles, role_rank, roles_for
from bitfit_hf.utils.names import is_under

logger = logging.getLogger(__name__)

METRIC = "(1/dim)·‖b0 − bF‖₁"
_OTHER = "bias"  # a trained bias no role names
_GAIN = "gain"  # a trained norm gain no role names
_PATTERN = "pattern"  # a tensor a pattern selected, that no selected role names
_WEIGHT = "weight"


@dataclass
class BiasChange:
    """Per bias type × layer change of a BitFit adapter against its base.

    ``values[i][j]`` is the change of ``roles[i]`` in ``layers[j]`` (``None`` where that layer has no
    such bias); ``average[i]`` is the mean over the layers that have one. ``outside_layers`` holds
    the biases that belong to no layer (embeddings LayerNorm, pooler, final norm, ...).
    """

    roles: List[str]
    layers: List[str]
    values: List[List[Optional[float]]]
    average: List[float]
    outside_layers: Dict[str, float] = field(default_factory=dict)
    base_model: str = ""
    metric: str = METRIC
    format_version: int = 1

    # ---- building ------------------------------------------------------------------------------
    @classmethod
    def compute(cls, base, adapter, strict: bool = False) -> "BiasChange":
        """``base``: the base model (module), a ``{name: tensor}`` dict of its biases, or a path /
        Hub id of its checkpoint; ``adapter``: a :class:`~bitfit_hf.BitFitAdapter` or a model
        prepared with ``apply_bitfit`` (typically after training)."""
        adapter = _as_adapter(adapter)
        cfg: AdapterConfig = adapter.config
        entries = classify(cfg)
        if not entries:
            raise ValueError("The adapter holds no trained bias vector (head only?): there is no bias change to show.")
        names = list(dict.fromkeys(e[0] for e in entries))
        base_tensors = _base_tensors(base, names, cfg)
        added = {f"{m}.bias" for m in cfg.added_biases}
        cells: Dict[Tuple[str, str], List[float]] = {}  # (role, layer) -> [abs sum, dim]
        missing = []
        for name, role, layer, chunk in entries:
            final = adapter.tensors.get(name)
            if final is None:
                continue
            if name in base_tensors:
                start = base_tensors[name]
            elif name in added:
                start = torch.zeros_like(final)
            else:
                missing.append(name)
                continue
            final = final.detach().to(torch.float32).reshape(-1)
            start = start.detach().to(torch.float32).reshape(-1)
            if start.numel() != final.numel():
                raise ValueError(
                    f"The base's {name} has {start.numel()} entries, the adapter's {final.numel()}: "
                    "this is not the base the adapter was trained on."
                )
            if chunk is not None:
                size = final.numel() // chunk[1]
                final = final[chunk[0] * size : (chunk[0] + 1) * size]
                start = start[chunk[0] * size : (chunk[0] + 1) * size]
            cell = cells.setdefault((role, layer), [0.0, 0])
            cell[0] += float((start - final).abs().sum())
            cell[1] += final.numel()
        if missing:
            message = (
                f"{len(missing)} of {len(names)} trained bias tensors were not found in the base "
                f"(e.g. {missing[0]!r}); they are left out of the bias-change map."
            )
            if strict or len(missing) == len(names):
                raise ValueError(message.replace("they are left out of the bias-change map.", "cannot compare."))
            logger.warning(message)
        return cls.from_cells({key: total / dim for key, (total, dim) in cells.items() if dim}, cfg.base_model_name_or_path)

    @classmethod
    def from_cells(cls, cells: Mapping[Tuple[str, str], float], base_model: str = "") -> "BiasChange":
        """Build from ``{(role, layer): change}``; layer ``""`` means outside the layers."""
        outside = {role: value for (role, layer), value in cells.items() if not layer}
        layered = {key: value for key, value in cells.items() if key[1]}
        layers = sorted({layer for _, layer in layered}, key=_layer_key)
        roles = list(dict.fromkeys(role for role, _ in layered))
        values = [[layered.get((role, layer)) for layer in layers] for role in roles]
        average = [_mean([v for v in row if v is not None]) for row in values]
        totals = [sum(v for v in row if v is not None) for row in values]
        order = sorted(range(len(roles)), key=lambda i: (-totals[i], role_rank(roles[i])))
        return cls(
            roles=[roles[i] for i in order],
            layers=layers,
            values=[values[i] for i in order],
            average=[average[i] for i in order],
            outside_layers=dict(sorted(outside.items(), key=lambda kv: -kv[1])),
            base_model=base_model,
        )

    # ---- (de)serialising -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format_version": self.format_version,
            "metric": self.metric,
            "base_model": self.base_model,
            "roles": list(self.roles),
            "layers": list(self.layers),
            "values": [[_round(v) for v in row] for row in self.values],
            "average": [_round(v) for v in self.average],
            "outside_layers": {k: _round(v) for k, v in self.outside_layers.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> "BiasChange":
        try:
            return cls(
                roles=list(data["roles"]),
                layers=[str(x) for x in data["layers"]],
                values=[list(row) for row in data["values"]],
                average=list(data["average"]),
                outside_layers=dict(data.get("outside_layers") or {}),
                base_model=data.get("base_model", ""),
                metric=data.get("metric", METRIC),
                format_version=int(data.get("format_version", 1)),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"Not a bias-change description ({err}).") from None

    def save(self, path: str) -> None:
        from bitfit_hf.utils.io import write_text_atomic

        write_text_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str) -> "BiasChange":
        with open(path, encoding="utf-8") as handle:
            return cls.from_dict(json.load(handle))

    # ---- reading ---------------------------------------------------------------------------------
    def value(self, role: str, layer: Union[str, int]) -> Optional[float]:
        return self.values[self.roles.index(role)][self.layers.index(str(layer))]

    def to_markdown(self, digits: int = 4) -> str:
        """The matrix as a Markdown table (rows sorted by total change; ``avg`` last)."""
        if not self.roles:
            return ""
        head = "| bias | " + " | ".join(self.layers) + " | avg |"
        rule = "| --- |" + " ---: |" * (len(self.layers) + 1)
        rows = [
            f"| `{role}` | " + " | ".join("" if v is None else f"{v:.{digits}f}" for v in row) + f" | {avg:.{digits}f} |"
            for role, row, avg in zip(self.roles, self.values, self.average)
        ]
        return "\n".join([head, rule, *rows])

    # ---- drawing -------------------------------------------------------------------------------
    def plot(self, path: str, title: Optional[str] = None, dpi: int = 110) -> str:
        """Render the heat map to a PNG at ``path`` (atomically); needs matplotlib."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError:
            raise ImportError("Drawing the bias-change heat map needs matplotlib: pip install 'bitfit-hf[plots]'.") from None
        import numpy as np

        from bitfit_hf.utils.io import atomic_path

        if not self.roles:
            raise ValueError("No per-layer bias change to draw.")
        matrix = np.array(
            [[np.nan if v is None else v for v in row] + [avg] for row, avg in zip(self.values, self.average)],
            dtype=float,
        )
        columns = list(self.layers) + ["avg"]
        width = min(2.2 + 0.55 * len(columns), 24.0)
        height = 1.3 + 0.42 * len(self.roles)
        figure = Figure(figsize=(width, height), dpi=dpi)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot(1, 1, 1)
        finite = matrix[np.isfinite(matrix)]
        vmax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        image = axes.imshow(np.ma.masked_invalid(matrix), cmap="Blues", vmin=0.0, vmax=vmax, aspect="auto")
        axes.set_xticks(range(len(columns)))
        axes.set_xticklabels(columns, fontsize=8)
        axes.set_yticks(range(len(self.roles)))
        axes.set_yticklabels(self.roles, fontsize=9)
        axes.set_xlabel("layer")
        axes.axvline(len(self.layers) - 0.5, color="white", linewidth=3)
        if len(columns) <= 26:
            for i in range(matrix.shape[0]):
                for j in range(matrix.shape[1]):
                    if np.isfinite(matrix[i, j]):
                        shade = "white" if matrix[i, j] > 0.6 * vmax else "black"
                        axes.text(j, i, _short(matrix[i, j]), ha="center", va="center", fontsize=6, color=shade)
        colorbar = figure.colorbar(image, ax=axes, fraction=0.04, pad=0.02)
        colorbar.ax.tick_params(labelsize=7)
        axes.set_title(title or f"Bias change per layer, {METRIC}", fontsize=10)
        figure.tight_layout()
        with atomic_path(path) as tmp:
            figure.savefig(tmp, format="png", metadata={"Software": None})
        return path


# ---- which tensor is which bias ------------------------------------------------------------------


def classify(config: AdapterConfig) -> List[Tuple[str, str, str, Optional[Tuple[int, int]]]]:
    """``(parameter name, role, layer, chunk)`` for every trained bias vector of the base in an adapter (not the
    head, nor a bias of a module the method inserted, which the base lacks: AdapterBias's ``L_alpha``).

    Roles come from the architecture's role table; a bias no role names is ``"bias"`` (its layer is
    its first integer path component, if any). For a fused bias (GPT-2 ``c_attn``) there is one
    entry per chunk, limited to the chosen roles when ``bias_terms`` names roles.
    """
    heads = list(config.head_modules)
    table = _role_table(config)
    chosen = _chosen_roles(config.bias_terms)
    out = []
    for name in config.trained_parameters:
        if not name.endswith(".bias") or is_under(name, heads) or tensor_role_of(config.method, name) is not None:
            continue
        module = _stock_module(name)
        found = [(name, role, layer, rule.chunk) for role, rule, layer in module_roles(table, module)
                 if rule.chunk is None or chosen is None or role in chosen]
        if not found:
            found.append((name, _OTHER, _layer_of(module), None))
        out.extend(found)
    return out


def classify_trained(adapter) -> List[Tuple[str, str, str, int]]:
    """``(parameter name, role, layer, count)`` for every tensor an adapter trained outside the head, named as the
    trainer's summary names them, so counts rebuilt from an adapter match the ones taken at training.

    The method's own tensors take its ``tensor_role`` (a sparse one counts its stored entries); a bias or a norm
    gain takes the role that selected it (``b_q``, ``g_LN1``; a fused bias one entry per chunk), else ``bias`` /
    ``gain`` under ``all`` / ``one-d``, else ``pattern`` where a pattern selected it, else the role of its module
    (a method that picks norms itself), else ``bias``, ``gain`` (a vector) or ``weight``.
    """
    cfg: AdapterConfig = adapter.config
    heads = list(cfg.head_modules)
    table = _role_table(cfg)
    terms = list(cfg.bias_terms or [])
    chosen = _chosen_roles(terms)  # None: every bias role
    chosen_gains = set(GAIN_ROLES) if terms == ["one-d"] else set(terms) & set(GAIN_ROLES)
    whole = terms in (["all"], ["one-d"])
    patterns = [re.compile(p) for p in cfg.patterns]
    sparse = set(cfg.sparse_parameters)
    out: List[Tuple[str, str, str, int]] = []
    for name in cfg.trained_parameters:
        if is_under(name, heads):
            continue
        module, attr = _stock_module(name), name.rsplit(".", 1)[-1]
        own = tensor_role_of(cfg.method, name)
        if name in sparse:
            out.append((name, own or "sparse", _layer_in(table, module), adapter.tensors[tensor_names(name)[0]].numel()))
            continue
        tensor = adapter.tensors.get(name)
        numel = tensor.numel() if tensor is not None else 0
        if own is not None:
            out.append((name, own, _layer_in(table, module), numel))
            continue
        vector = tensor is not None and tensor.dim() == 1
        if attr == "bias":
            found = list(module_roles(table, module))
            picked = [f for f in found if chosen is None or f[0] in chosen]
        elif attr == "weight" and vector:
            found = list(module_roles(table, module, list(GAIN_ROLES)))
            picked = [f for f in found if f[0] in chosen_gains]
        else:
            found = picked = []
        if picked:
            out.extend(_role_entries(name, numel, picked))
        elif whole and (attr == "bias" or (vector and terms == ["one-d"])):
            out.append((name, _OTHER if attr == "bias" else _GAIN, "", numel))
        elif any(p.fullmatch(name) for p in patterns):
            out.append((name, _PATTERN, "", numel))
        elif found:  # a method that picks its norms itself (AdapterBias)
            out.extend(_role_entries(name, numel, found))
        else:
            out.append((name, _OTHER if attr == "bias" else _GAIN if vector else _WEIGHT, "", numel))
    return out


def _role_entries(name: str, numel: int, found) -> List[Tuple[str, str, str, int]]:
    """One entry per ``(role, rule, layer)``: a chunk of a fused bias counts its share."""
    return [(name, role, layer, numel // rule.chunk[1] if rule.chunk else numel) for role, rule, layer in found]


def _role_table(config: AdapterConfig):
    return (ARCHITECTURE_ROLES.get(config.model_type) and roles_for(config.model_type)) or {}


def _layer_in(table, module: str) -> str:
    """The layer label of the nearest module at or above ``module`` that a role names (a method's tensors sit in
    or under a stock module: ``...query.lora_A``); ``""`` outside the layers."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        for _, _, layer in module_roles(table, ".".join(parts[:end])):
            return layer
    return ""


def _stock_module(name: str) -> str:
    """The module of a parameter name, under its stock name where peft wrapped it (LoRA, (IA)³)."""
    module = name.rsplit(".", 1)[0]
    return module[: -len(BASE_LAYER) - 1] if module.endswith("." + BASE_LAYER) else module


def _chosen_roles(bias_terms: Iterable[str]) -> Optional[set]:
    terms = list(bias_terms or [])
    if len(terms) == 1 and terms[0] in PRESETS:
        preset = PRESETS[terms[0]]
        return None if preset is None else set(preset)
    return set(terms) or None


def _layer_of(module: str) -> str:
    for part in module.split("."):
        if part.isdigit():
            return part
    return ""


# ---- the base's biases -----------------------------------------------------------------------------


def snapshot_biases(model: nn.Module, names: Optional[Iterable[str]] = None) -> Dict[str, torch.Tensor]:
    """Copies (CPU, float32) of a model's bias vectors, to compare with after training.

    ``names`` defaults to every parameter whose name ends in ``.bias``. Under DeepSpeed ZeRO-3 the
    parameters are gathered first (collective: call it on every rank).
    """
    from bitfit_hf.tuners.state import unwrap
    from bitfit_hf.utils.zero import gathered

    params = dict(unwrap(model).named_parameters())
    wanted = [n for n in (names if names is not None else params) if n in params and n.endswith(".bias")]
    with gathered([params[n] for n in wanted]):
        return {n: params[n].detach().to("cpu", torch.float32, copy=True).reshape(-1) for n in wanted}


def _base_tensors(base, names: List[str], cfg: AdapterConfig) -> Dict[str, torch.Tensor]:
    if isinstance(base, nn.Module):
        from bitfit_hf.tuners.state import get_tuner_state, unwrap

        if get_tuner_state(base) is not None:
            logger.warning("The base model given for the bias change was prepared with apply_bitfit: "
                           "if it was trained, its biases are not the pretrained ones.")
        params = dict(unwrap(base).named_parameters())
        return {n: params[n] for n in names if n in params}
    if isinstance(base, Mapping):
        return {n: base[n] for n in names if n in base}
    if isinstance(base, (str, os.PathLike)):
        return read_checkpoint_biases(str(base), names, revision=cfg.base_model_revision)
    raise TypeError(f"base must be a model, a dict of tensors or a checkpoint path / Hub id, not {type(base).__name__}.")


def _as_adapter(adapter):
    from bitfit_hf.adapters.adapter import BitFitAdapter

    if isinstance(adapter, BitFitAdapter):
        return adapter
    if isinstance(adapter, nn.Module):
        return BitFitAdapter.from_model(adapter)
    if isinstance(adapter, (str, os.PathLike)):
        return BitFitAdapter.from_directory(str(adapter))
    raise TypeError(f"Expected a BitFitAdapter or a model prepared with apply_bitfit, not {type(adapter).__name__}.")


# ---- helpers ----------------------------------------------------------------------------------------


def bias_change(base, adapter, strict: bool = False) -> BiasChange:
    """Shorthand for :meth:`BiasChange.compute`."""
    return BiasChange.compute(base, adapter, strict=strict)


def _layer_key(label: str):
    stacks = {"encoder": 0, "decoder": 1}
    return [(0, int(p), "") if p.isdigit() else (1, stacks.get(p, 2), p) for p in label.split(".")]



def _mean(values: List[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _round(value):
    if value is None:
        return None
    value = float(value)
    return value if not math.isfinite(value) else float(f"{value:.6g}")


def _short(value: float) -> str:
    if value == 0:
        return "0"
    text = f"{value:.2g}"
    return text[1:] if text.startswith("0.") else text
