"""A readable account of what is trainable: counts and fractions per role and layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from bitfit_hf.tuners.roles import ALL_ROLES, HEAD, role_rank


@dataclass
class TrainableSummary:
    """Trainable parameter counts of a :class:`Selection`, per role and per layer.

    ``fraction`` values are relative to the model's parameter count before any bias was added, which
    is how the paper reports "0.09% of BERT-base".
    """

    total_params: int
    per_role: Dict[str, int]
    tensors_per_role: Dict[str, int]
    per_role_layer: Dict[str, Dict[str, int]]
    descriptions: Dict[str, str] = field(default_factory=dict)  # roles a method adds (AdapterBias's ab_v, ...)
    # Facts a method adds about its trained state ({"l0": {"gated": ..., "expected_active": ...}}); in to_dict
    # and the text only when present.
    notes: Dict[str, Dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_selection(cls, selection: Any) -> "TrainableSummary":
        """From a ``tuners.state.Selection`` (read through its ``entries``, ``total_params`` and ``config``;
        not imported, so that state.py can build summaries without an import loop)."""
        per_role: Dict[str, int] = {}
        tensors: Dict[str, int] = {}
        per_layer: Dict[str, Dict[str, int]] = {}
        for entry in selection.entries:
            per_role[entry.role] = per_role.get(entry.role, 0) + entry.numel
            tensors[entry.role] = tensors.get(entry.role, 0) + 1
            layers = per_layer.setdefault(entry.role, {})
            layers[entry.layer] = layers.get(entry.layer, 0) + entry.numel
        descriptions = dict(getattr(selection.config, "role_descriptions", {}) or {})
        return cls(selection.total_params, per_role, tensors, per_layer, descriptions)

    @property
    def trainable_params(self) -> int:
        return sum(self.per_role.values())

    @property
    def bias_params(self) -> int:
        """Everything trained except the task head."""
        return sum(n for role, n in self.per_role.items() if role != HEAD)

    def fraction(self, count: int) -> float:
        return count / self.total_params if self.total_params else 0.0

    @property
    def bias_fraction(self) -> float:
        return self.fraction(self.bias_params)

    def layers(self) -> List[str]:
        labels = {layer for layers in self.per_role_layer.values() for layer in layers if layer}
        return sorted(labels, key=lambda s: [int(p) if p.isdigit() else p for p in s.split(".")])

    def to_dict(self) -> dict:
        return {
            "total_params": self.total_params,
            "trainable_params": self.trainable_params,
            "trainable_fraction": self.fraction(self.trainable_params),
            "bias_params": self.bias_params,
            "bias_fraction": self.bias_fraction,
            "per_role": dict(self.per_role),
            "tensors_per_role": dict(self.tensors_per_role),
            "per_role_layer": {role: dict(layers) for role, layers in self.per_role_layer.items()},
            **({"notes": {key: dict(value) for key, value in self.notes.items()}} if self.notes else {}),
        }

    def __str__(self) -> str:
        lines = [f"{'role':<12} {'tensors':>8} {'params':>12} {'% of model':>11}  what"]
        for role in sorted(self.per_role, key=lambda r: role_rank(r, self.descriptions)):
            what = self.descriptions.get(role) or ALL_ROLES.get(role, {"head": "task head", "bias": "other bias", "pattern": "user pattern",
                                        "weight": "weight (full fine-tuning)", "gain": "other norm gain",
                                        "random": "random entries of weight matrices"}.get(role, ""))
            lines.append(
                f"{role:<12} {self.tensors_per_role[role]:>8} {self.per_role[role]:>12,} "
                f"{100 * self.fraction(self.per_role[role]):>10.4f}%  {what}"
            )
        lines.append(
            f"{'trainable':<12} {sum(self.tensors_per_role.values()):>8} {self.trainable_params:>12,} "
            f"{100 * self.fraction(self.trainable_params):>10.4f}%  of {self.total_params:,} parameters "
            f"(without the head: {self.bias_params:,} = {100 * self.bias_fraction:.4f}%)"
        )
        for key, facts in self.notes.items():
            lines.append(f"{key}: " + ", ".join(f"{k}={v}" for k, v in facts.items()))
        layers = self.layers()
        if layers and len(layers) <= 48:
            roles = [r for r in sorted(self.per_role_layer, key=lambda r: role_rank(r, self.descriptions)) if any(self.per_role_layer[r].get(l) for l in layers)]
            lines.append("")
            lines.append("per layer: " + " ".join(f"{r:>8}" for r in roles))
            for layer in layers:
                lines.append(f"{layer:>10} " + " ".join(f"{self.per_role_layer[r].get(layer, 0):>8}" for r in roles))
        return "\n".join(lines)

