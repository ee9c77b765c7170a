"""The ``bitfit`` method as registered: bias terms (all, presets, paper roles or patterns) plus the head."""

from __future__ import annotations

from typing import Any, Optional

from bitfit_hf.tuners.bias.config import BitFitConfig
from bitfit_hf.tuners.bias.model import apply_bitfit
from bitfit_hf.tuners.bitfit.recipe import RECIPE
from bitfit_hf.tuners.registry import Method, bias_terms_of


class BitFit(Method):
    name = "bitfit"
    config_class = BitFitConfig
    description = "bias terms (all, presets, paper roles or patterns) + head"
    recipe = RECIPE
    beft_export = True  # a plain bias selection is a PEFT BEFT adapter

    def apply(self, model, config):
        return apply_bitfit(model, config)

    def label(self, config: Any) -> Optional[str]:
        """BitFit's presets have a ``--method`` of their own: ``frozen`` (the head only) and ``full``."""
        terms = bias_terms_of(config)
        return terms[0] if terms in (["frozen"], ["full"]) else None
