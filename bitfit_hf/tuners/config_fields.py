"""What method configs share in reading their fields: the bias-selection fields every adapter records, which a
method without a bias selection accepts only at their neutral values, and layer-wise rate decay."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence


def from_fields(cls: type, data: Dict[str, Any], neutral: Dict[str, Sequence[Any]], method: str, refusal: str):
    """``cls(**data)`` for a dataclass config, after dropping the recorded fields of ``neutral`` (their accepted
    values); another value there is refused with ``refusal`` ("it trains ..."), naming ``method``; an unknown
    field by name."""
    data = dict(data)
    for key, accepted in neutral.items():
        if key in data:
            value = data.pop(key)
            if value not in accepted:
                raise ValueError(f"{method} has no {key!r} setting (got {value!r}): {refusal}.")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"Unknown {cls.__name__} field(s) {unknown}; known fields: {sorted(known)}.")
    return cls(**data)


def layer_scale(decay: Optional[float], role: str, depth: int) -> float:
    """Layer-wise decay's factor on the rate of a tensor ``depth`` layers below the top; the head keeps its rate."""
    if decay is None or role == "head":
        return 1.0
    return float(decay) ** depth

