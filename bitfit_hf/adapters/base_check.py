"""Is the model given the base an adapter was trained on? Exactly (fingerprint), or loaded another way.

The fingerprint hashes stored values, so it only matches a base loaded the same way. When the
adapter records another loading than the model's (a GGUF file or 4-bit weights against full precision),
the adapter's sketch (:func:`bitfit_hf.utils.fingerprint.base_sketch`) decides instead: same names and
logical shapes, and sampled weights equal within quantization error. Every refusal says which check
failed and why.
"""

from __future__ import annotations

import logging

from torch import nn

from bitfit_hf.adapters.config import AdapterConfig, BaseModelMismatchError
from bitfit_hf.utils.base_loading import describe_base_loading, describe_for_humans
from bitfit_hf.utils.fingerprint import SKETCH_TOLERANCE, base_sketch, sketch_difference

logger = logging.getLogger(__name__)


def _same_loading(a: dict, b: dict) -> bool:
    def key(d):
        config = d.get("quantization_config") or {}
        return (d.get("quant_method"), d.get("gguf_file"), bool(config.get("load_in_4bit")),
                bool(config.get("load_in_8bit")), config.get("bnb_4bit_quant_type"))
    return key(a or {}) == key(b or {})


def check_same_base(cfg: AdapterConfig, state, model: nn.Module) -> None:
    """Raise :class:`BaseModelMismatchError` unless ``model`` holds the base ``cfg`` was trained on."""
    if state.fingerprint == cfg.base_fingerprint:
        return
    found_loading = describe_base_loading(model)
    trained = describe_for_humans(cfg.base_loading)
    given = describe_for_humans(found_loading)
    where = (f"This adapter was trained on base {cfg.base_model_name_or_path!r}"
             f"{'@' + cfg.base_model_revision if cfg.base_model_revision else ''} loaded as {trained} "
             f"(fingerprint {cfg.base_fingerprint}); the model given was loaded from "
             f"{getattr(getattr(model, 'config', None), '_name_or_path', '?')!r} as {given} "
             f"(fingerprint {state.fingerprint})")
    if _same_loading(cfg.base_loading, found_loading):
        raise BaseModelMismatchError(
            f"{where}: its frozen weights differ. Load the adapter onto the base it was trained on (check the revision)."
        )
    if not cfg.base_sketch:
        raise BaseModelMismatchError(
            f"{where}. The fingerprint hashes stored values, which differ between these two loadings, and this "
            f"adapter records no sketch to compare them otherwise (it predates that). Load the base as {trained}, "
            "or pass check_base=False if you know it is the same base."
        )
    found = getattr(state, "base_sketch", None) or {}
    if set(found.get("samples") or {}) != set(cfg.base_sketch.get("samples") or {}):
        # The method's own sketch (taken on the stock base, before LoRA wraps modules) samples other
        # tensors, or there is none: sketch the model as it stands, at the adapter's sampled names.
        exclude = set(cfg.trained_parameters) | set(cfg.adapter_parameters)
        found = base_sketch(model, exclude=exclude, head_modules=cfg.head_modules,
                            names=list(cfg.base_sketch.get("samples", {})))
    if found["structure"] != cfg.base_sketch.get("structure"):
        raise BaseModelMismatchError(f"{where}: the frozen tensors' names or shapes differ, so it is another architecture or size.")
    difference = sketch_difference(cfg.base_sketch, found)
    if difference is None:
        raise BaseModelMismatchError(
            f"{where}. Names and shapes match, but this {found_loading.get('quant_method', 'full-precision')} "
            "model's weights cannot be read back as floats to compare values, so it cannot be verified as the "
            f"same base. Load the base as {trained}, or pass check_base=False if you know it is the same base."
        )
    if difference > SKETCH_TOLERANCE:
        raise BaseModelMismatchError(
            f"{where}: sampled weights differ by {difference:.0%} of their norm (quantization alone stays under "
            f"{SKETCH_TOLERANCE:.0%}), so it is another base."
        )
    logger.info("Same base loaded another way (%s, adapter trained on %s): sampled weights within %.1f%%.",
                given, trained, 100 * difference)
