"""``BitFitConfig``: what BitFit trains. It lives in :mod:`bitfit_hf.tuners.bias.config`, shared with the methods
defined relative to a bias selection; this module keeps the method's import path."""

from bitfit_hf.tuners.bias.config import BitFitConfig, normalize_bias_terms, parse_bias_init

__all__ = ["BitFitConfig", "normalize_bias_terms", "parse_bias_init"]
