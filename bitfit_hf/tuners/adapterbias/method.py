"""AdapterBias as registered: its card prose, citation and hooks."""

from __future__ import annotations

from typing import Any

from bitfit_hf.tuners.adapterbias.config import AdapterBiasConfig
from bitfit_hf.tuners.adapterbias.model import (
    adapterbias_route,
    adapterbias_tensor_role,
    apply_adapterbias,
    insert_shifts,
    l0_penalty,
    release_adapter,
)
from bitfit_hf.tuners.adapterbias.recipe import RECIPE
from bitfit_hf.tuners.registry import Method, method_fields, method_settings

#: Why the shift is no weight or bias of the stock model: it cannot be merged.
TOKEN_DEPENDENT = ("AdapterBias adds a token-dependent shift L_alpha(h)*v to each FFN output (its size depends on each "
                   "token's hidden state), which no bias or weight of the stock architecture can hold")

CITATION = """@inproceedings{fu-etal-2022-adapterbias,
    title = "{A}dapter{B}ias: Parameter-efficient Token-dependent Representation Shift for Adapters in {NLP} Tasks",
    author = "Fu, Chin-Lun and Chen, Zih-Ching and Lee, Yun-Ru and Lee, Hung-yi",
    booktitle = "Findings of the Association for Computational Linguistics: NAACL 2022",
    year = "2022",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2022.findings-naacl.199",
    pages = "2608--2621",
}"""


class AdapterBias(Method):
    name = "adapterbias"
    config_class = AdapterBiasConfig
    description = ("a token-dependent shift L_alpha(h)*v on each FFN output projection, the FFN and embeddings "
                   "LayerNorms (gain and bias) and the task head")
    display_name = "AdapterBias"
    paper = ("AdapterBias: Parameter-efficient Token-dependent Representation Shift for Adapters in NLP Tasks "
             "(Fu et al., Findings of NAACL 2022): https://aclanthology.org/2022.findings-naacl.199")
    citation = CITATION
    recipe = RECIPE
    inserts_modules = True
    not_mergeable = TOKEN_DEPENDENT

    def apply(self, model, config):
        return apply_adapterbias(model, config)

    def prepare_base(self, model, config) -> None:
        insert_shifts(model, config)

    def tensor_role(self, name: str):
        return adapterbias_tensor_role(name)

    def route(self, model, name, method_config):
        return adapterbias_route(name)

    def penalty(self, model, state):
        return l0_penalty(model, state)

    def release(self, config, tensors):
        return release_adapter(config, tensors)

    def describe(self, config: Any) -> str:
        l0 = AdapterBiasConfig.describe_l0(method_fields(config))
        return f"adapterbias ({method_settings(config, skip=('l0_lambda', 'l0_folded'))}" + (f"; {l0})" if l0 else ")")
