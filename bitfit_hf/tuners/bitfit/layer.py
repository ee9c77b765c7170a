"""How BitFit changes one module (a bias added where there is none): :mod:`bitfit_hf.tuners.bias.layer`, shared
with the other bias-training methods; this module keeps the method's import path."""

from bitfit_hf.tuners.bias.layer import (
    HOOK,
    HOOK_ATTR,
    NATIVE,
    add_zero_bias,
    add_zero_biases,
    bias_kind,
    has_bias,
    initialize_biases,
    remove_added_bias,
)

__all__ = ["HOOK", "HOOK_ATTR", "NATIVE", "add_zero_bias", "add_zero_biases", "bias_kind", "has_bias",
           "initialize_biases", "remove_added_bias"]
