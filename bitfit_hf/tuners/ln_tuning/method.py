"""LayerNorm tuning as registered: its card prose, citation and hooks.

Its tensors are stock ones (the norms' ``weight`` / ``bias`` and the head), named by their roles without a
``tensor_role`` of its own, and the trained model's own state dict is the merged checkpoint: ``merge`` keeps the
default; mixed batches route its gains and biases as stock norm tensors (no ``route`` of its own).
"""

from __future__ import annotations

from typing import Any

from bitfit_hf.tuners.ln_tuning import model as ln_model
from bitfit_hf.tuners.ln_tuning.config import LNTuningMethodConfig
from bitfit_hf.tuners.ln_tuning.recipe import RECIPE
from bitfit_hf.tuners.registry import Method, method_label

CITATION = """@inproceedings{zhao2024tuning,
    title = "Tuning {L}ayer{N}orm in Attention: Towards Efficient Multi-Modal {LLM} Finetuning",
    author = "Zhao, Bingchen and Tu, Haoqin and Wei, Chen and Mei, Jieru and Xie, Cihang",
    booktitle = "The Twelfth International Conference on Learning Representations (ICLR 2024)",
    year = "2024",
    url = "https://arxiv.org/abs/2312.11420",
}"""


class LNTuning(Method):
    name = "ln_tuning"
    config_class = LNTuningMethodConfig
    description = ("the gain and, where it has one, the bias of every normalisation layer (LayerNorm, RMSNorm) "
                   "+ head")
    display_name = "LN tuning"
    paper = ("Tuning LayerNorm in Attention: Towards Efficient Multi-Modal LLM Finetuning (Zhao et al., ICLR 2024): "
             "https://arxiv.org/abs/2312.11420")
    citation = CITATION
    recipe = RECIPE

    def apply(self, model, config):
        return ln_model.apply_ln_tuning(model, config)

    def peft_model(self, model, config, modules_to_save, task_type):
        return ln_model.peft_model(model, config, modules_to_save, task_type)

    def describe(self, config: Any) -> str:
        """``ln_tuning (every norm's gain and bias)``, for a method config or an adapter config alike."""
        return f"{method_label(config)} (every normalisation layer's gain and bias)"
