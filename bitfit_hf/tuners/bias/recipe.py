"""``--bias_terms`` as the bias selection of the recipe methods that take it (``bitfit``, ``bitfit_lora``,
``bitfit_ia3``): shared, as the selection itself is."""

from __future__ import annotations

from typing import List, Union

from bitfit_hf.tuners.recipe import CommonFlags, FlagRefused

#: BitFit's presets that the recipes spell as a ``--method`` of their own (which also picks the learning rate).
METHOD_PRESETS = ("full", "frozen")


def bias_selection(common: CommonFlags) -> Union[str, List[str]]:
    """The ``bias_terms`` a method's config gets from ``--bias_terms`` (default ``all``); a preset the recipes spell
    as a ``--method`` is refused."""
    for preset in METHOD_PRESETS:
        if preset in common.bias_terms:
            raise FlagRefused(f"--bias_terms {preset} is spelled --method {preset} in the recipes (it also picks the "
                              f"learning-rate default for {preset}).")
    return common.bias_terms or "all"
