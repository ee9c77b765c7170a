"""Where a stored tensor acts in a mixed batch (:class:`Route`): what a method's ``route`` hook answers, and what
the per-example routing of :mod:`bitfit_hf.adapters.routing` holds per module."""

from __future__ import annotations

from dataclasses import dataclass

#: The kinds of change, in the order a forward pass applies them (``scale_in`` before the module runs).
KINDS = ("scale_in", "gain", "bias", "lora", "shift", "scale_out")
#: ``Route.module`` of a tensor shared by a method's modules (AdapterBias's shared L_alpha): it goes to every module
#: where the same adapter has a shift vector.
ANY_SHIFT = "*"


@dataclass(frozen=True)
class Route:
    """Where one stored tensor acts: on ``module``, as a change of ``kind`` (one of :data:`KINDS`); ``slot`` names
    its part in that kind (LoRA's ``A`` / ``B``, a shift's ``v`` / ``w`` / ``c``); ``scale`` multiplies it (LoRA's
    ``alpha / r``)."""

    module: str
    kind: str
    slot: str = ""
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Route kind {self.kind!r} is not one of {KINDS}")
