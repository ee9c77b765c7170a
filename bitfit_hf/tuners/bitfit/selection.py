"""BitFit's resolver (roles -> exact tensors): :mod:`bitfit_hf.tuners.bias.selection`, shared with the methods
defined relative to a bias selection; this module keeps the method's import path."""

from bitfit_hf.tuners.bias.selection import (
    EMBEDDING_ROLES,
    GAIN,
    HEAD,
    OTHER_BIAS,
    PATTERN,
    WEIGHT,
    Selection,
    TrainedTensor,
    count_layers,
    detect_head_modules,
    is_norm,
    layer_depths,
    resolve,
)

__all__ = ["EMBEDDING_ROLES", "GAIN", "HEAD", "OTHER_BIAS", "PATTERN", "WEIGHT", "Selection", "TrainedTensor",
           "count_layers", "detect_head_modules", "is_norm", "layer_depths", "resolve"]
