"""The serialised description of a bias-only adapter (``adapter_config.json``)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from bitfit_hf.tuners import config_from_dict
from bitfit_hf.tuners.bitfit.config import BitFitConfig
from bitfit_hf.utils.constants import CONFIG_NAME, SUMMARY_NAME, WEIGHTS_NAME  # noqa: F401 - re-exported
from bitfit_hf.utils.errors import UserError

FORMAT_VERSION = 1
ADAPTER_TYPE = "BITFIT"


class AdapterError(UserError, ValueError):
    """An adapter cannot be read or does not fit the model it is applied to."""


class BaseModelMismatchError(AdapterError):
    """The adapter was trained on another base model than the one it is applied to."""


# Maps the last word of a transformers class name to PEFT-style task types.
_TASK_TYPES = {
    "ForSequenceClassification": "SEQ_CLS",
    "ForTokenClassification": "TOKEN_CLS",
    "ForQuestionAnswering": "QUESTION_ANS",
    "ForCausalLM": "CAUSAL_LM",
    "ForMaskedLM": "MASKED_LM",
    "ForMultipleChoice": "MULTIPLE_CHOICE",
    "ForConditionalGeneration": "SEQ_2_SEQ_LM",
}


def task_type_of(architecture: str) -> Optional[str]:
    for suffix, task in _TASK_TYPES.items():
        if architecture.endswith(suffix):
            return task
    return None


@dataclass
class AdapterConfig:
    """Everything needed to re-apply an adapter to a stock base model, and to check it is the right one.

    ``adapter_parameters`` are the tensors in ``adapter_model.safetensors`` (trained biases, added
    biases and the task head); ``trained_parameters`` those of them that were trained.
    """

    base_model_name_or_path: str
    model_type: str
    architecture: str
    trained_parameters: List[str]
    adapter_parameters: List[str]
    base_fingerprint: str
    bias_terms: List[str] = field(default_factory=lambda: ["all"])
    patterns: List[str] = field(default_factory=list)
    train_head: bool = True
    head_modules: List[str] = field(default_factory=list)
    add_missing_biases: bool = False
    added_biases: Dict[str, str] = field(default_factory=dict)
    base_model_revision: Optional[str] = None
    task_type: Optional[str] = None
    num_labels: Optional[int] = None
    id2label: Optional[Dict[str, str]] = None
    label2id: Optional[Dict[str, int]] = None
    problem_type: Optional[str] = None
    dtype: str = "float32"
    method: str = "bitfit"
    method_config: Dict[str, Any] = field(default_factory=dict)  # the method's own fields (not BitFit's)
    base_loading: Dict[str, Any] = field(default_factory=dict)  # GGUF file / quantizer config; {}: full precision
    base_sketch: Dict[str, Any] = field(default_factory=dict)  # names, shapes, sampled weights (any loading)
    adapter_type: str = ADAPTER_TYPE
    format_version: int = FORMAT_VERSION
    library_name: str = "bitfit-hf"
    library_version: str = ""
    metadata: Dict[str, Any] = field(default_factory=dict)  # training arguments, eval results, ...

    REQUIRED = ("base_model_name_or_path", "model_type", "architecture", "trained_parameters",
                "adapter_parameters", "base_fingerprint")

    def bitfit_config(self) -> BitFitConfig:
        return BitFitConfig(
            bias_terms=self.bias_terms,
            patterns=self.patterns,
            train_head=self.train_head,
            head_modules=self.head_modules,
            add_missing_biases=self.add_missing_biases,
        )

    def tuner_config(self):
        """The config of the adapter's method, ready for :func:`bitfit_hf.tuners.apply_method`."""
        if self.method == "bitfit":
            return self.bitfit_config()
        fields = {**self.method_config, "bias_terms": self.bias_terms, "patterns": self.patterns,
                  "train_head": self.train_head, "head_modules": self.head_modules,
                  "add_missing_biases": self.add_missing_biases}
        try:
            return config_from_dict(self.method, fields)
        except ValueError as err:
            raise AdapterError(f"This adapter's method cannot be rebuilt: {err}") from None

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any, source: str = "adapter config") -> "AdapterConfig":
        if not isinstance(data, dict):
            raise AdapterError(f"{source} must hold a JSON object, found {type(data).__name__}.")
        if data.get("adapter_type", ADAPTER_TYPE) != ADAPTER_TYPE:
            raise AdapterError(
                f"{source} describes a {data.get('adapter_type')!r} adapter (PEFT?), not a BitFit adapter. "
                "Load it with the library that wrote it."
            )
        missing = [key for key in cls.REQUIRED if key not in data]
        if missing:
            raise AdapterError(f"{source} misses required field(s) {missing}; it was not written by bitfit-hf or is damaged.")
        known = {f.name for f in dataclasses.fields(cls)}
        config = cls(**{k: v for k, v in data.items() if k in known})
        for key in ("trained_parameters", "adapter_parameters"):
            value = getattr(config, key)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise AdapterError(f"{source}: field {key!r} must be a list of parameter names.")
        return config

    @classmethod
    def from_json(cls, text: str, source: str = CONFIG_NAME) -> "AdapterConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise AdapterError(f"{source} is not valid JSON ({err}); the adapter is damaged — save or download it again.") from None
        return cls.from_dict(data, source)
