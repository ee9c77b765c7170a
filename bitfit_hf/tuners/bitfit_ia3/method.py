"""(IA)³ and BitFit + (IA)³ as registered: one set of hooks, two configs."""

from __future__ import annotations

from typing import Any, Optional

from bitfit_hf.tuners.bitfit_ia3 import layer
from bitfit_hf.tuners.bitfit_ia3 import model as ia3_model
from bitfit_hf.tuners.bitfit_ia3.config import IA3, BitFitIA3Config, IA3Config
from bitfit_hf.tuners.bitfit_ia3.recipe import BITFIT_IA3_RECIPE, IA3_RECIPE
from bitfit_hf.tuners.registry import Method, method_settings, selection_words

CITATION = """@inproceedings{liu2022fewshot,
    title = "Few-Shot Parameter-Efficient Fine-Tuning is Better and Cheaper than In-Context Learning",
    author = "Liu, Haokun and Tam, Derek and Muqeeth, Mohammed and Mohta, Jay and Huang, Tenghao and Bansal, Mohit and Raffel, Colin",
    booktitle = "Advances in Neural Information Processing Systems",
    year = "2022",
    url = "https://arxiv.org/abs/2205.05638",
}"""


class IA3Method(Method):
    """What ``ia3`` and ``bitfit_ia3`` share: peft (IA)³ layers, routed per example in mixed-task batches (a vector
    scales each example's output, or a feedforward module's input) and exported as peft's own IA3 tuner."""

    paper = ("Few-Shot Parameter-Efficient Fine-Tuning is Better and Cheaper than In-Context Learning (Liu et al., "
             "NeurIPS 2022): https://arxiv.org/abs/2205.05638")
    citation = CITATION
    inserts_modules = True

    def apply(self, model, config):
        return ia3_model.apply_bitfit_ia3(model, config)

    def tensor_role(self, name: str) -> Optional[str]:
        return IA3 if layer.is_ia3_tensor(name) else None

    def merge(self, state, model):
        return state.merged_state_dict(model)

    def route(self, model, name, method_config):
        return ia3_model.route(model, name, method_config)

    def peft_model(self, model, config, modules_to_save, task_type):
        return ia3_model.peft_model(model, config, modules_to_save, task_type)

    def describe(self, config: Any) -> str:
        return f"{self.name} (bias terms {selection_words(config)}; {method_settings(config) or 'paper targets'})"


class IA3Only(IA3Method):
    name = "ia3"
    config_class = IA3Config
    description = "peft (IA)³ scaling vectors on keys, values and the FFN's inner activation + head, no bias term"
    display_name = "(IA)³"
    recipe = (IA3_RECIPE,)


class BitFitIA3(IA3Method):
    name = "bitfit_ia3"
    config_class = BitFitIA3Config
    description = ("bias terms + head, plus peft (IA)³ scaling vectors on keys, values and the FFN's inner "
                   "activation")
    display_name = "BitFit + (IA)³"
    recipe = (BITFIT_IA3_RECIPE,)
