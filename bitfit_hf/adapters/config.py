"""The serialised description of a bias-only adapter (``adapter_config.json``)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from bitfit_hf.adapters.task_types import CAUSAL_LM, MASKED_LM, MULTIPLE_CHOICE, QUESTION_ANS, SEQ_2_SEQ_LM, SEQ_CLS, TOKEN_CLS
from bitfit_hf.tuners import config_from_dict
from bitfit_hf.tuners.bias.config import BitFitConfig
from bitfit_hf.utils.constants import CONFIG_NAME, __version__
from bitfit_hf.utils.errors import UserError
from bitfit_hf.utils.secrets import redact

FORMAT_VERSION = 2
"""Adapter format written by this version. 2 = 1 plus ``tensors_sha256`` (a content hash of the
tensors, required from 2 on). Readers accept every version up to their own and refuse newer ones: a
newer format may change what a field means, so loading it silently could give a wrong model."""
ADAPTER_TYPE = "BITFIT"


class AdapterError(UserError, ValueError):
    """An adapter cannot be read or does not fit the model it is applied to."""


class BaseModelMismatchError(AdapterError):
    """The adapter was trained on another base model than the one it is applied to."""


# Maps the last word of a transformers class name to PEFT-style task types.
_TASK_TYPES = {
    "ForSequenceClassification": SEQ_CLS,
    "ForTokenClassification": TOKEN_CLS,
    "ForQuestionAnswering": QUESTION_ANS,
    "ForCausalLM": CAUSAL_LM,
    "ForMaskedLM": MASKED_LM,
    "ForMultipleChoice": MULTIPLE_CHOICE,
    "ForConditionalGeneration": SEQ_2_SEQ_LM,
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
    biases and the task head); ``trained_parameters`` the model parameters that were trained.
    ``sparse_parameters`` are trained parameters stored as indices + values (see
    :mod:`bitfit_hf.adapters.sparse`) rather than whole.
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
    # The sentence-transformers pooling the head classifies from ("mean", "cls", ...; the base's pooler
    # removed), as :func:`bitfit_hf.utils.sentence_pooling.install_sentence_pooling` builds it; None: the
    # architecture's own path.
    sentence_pooling: Optional[str] = None
    sparse_parameters: List[str] = field(default_factory=list)
    adapter_type: str = ADAPTER_TYPE
    format_version: int = FORMAT_VERSION
    tensors_sha256: Optional[str] = None  # bitfit_hf.adapters.integrity.tensors_digest of the weights file
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
        """The config of the adapter's method, ready for :func:`bitfit_hf.tuners.apply_method`: the method's
        own fields (``method_config``) over the bias-selection fields every adapter records."""
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
        """The serialised config; credentials in ``metadata`` (tokens, passwords) are never written."""
        data = self.to_dict()
        data["metadata"] = redact(data.get("metadata") or {})
        return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any, source: str = "adapter config") -> "AdapterConfig":
        if not isinstance(data, dict):
            raise AdapterError(f"{source} must hold a JSON object, found {type(data).__name__}.")
        if data.get("adapter_type", ADAPTER_TYPE) != ADAPTER_TYPE:
            raise AdapterError(
                f"{source} describes a {data.get('adapter_type')!r} adapter (PEFT?), not a BitFit adapter. "
                "Load it with the library that wrote it."
            )
        check_format_version(data.get("format_version", 1), source)
        missing = [key for key in cls.REQUIRED if key not in data]
        if missing:
            raise AdapterError(f"{source} misses required field(s) {missing}; it was not written by bitfit-hf or is damaged.")
        known = {f.name for f in dataclasses.fields(cls)}
        config = cls(**{k: v for k, v in data.items() if k in known})
        for key in ("trained_parameters", "adapter_parameters"):
            value = getattr(config, key)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise AdapterError(f"{source}: field {key!r} must be a list of parameter names.")
        _check_field_types(config, source)
        return config

    @classmethod
    def from_json(cls, text: str, source: str = CONFIG_NAME) -> "AdapterConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise AdapterError(f"{source} is not valid JSON ({err}); the adapter is damaged — save or download it again.") from None
        return cls.from_dict(data, source)


def check_format_version(version: Any, source: str) -> None:
    """Refuse a format this version cannot read: a newer one, or a value that is not a version."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise AdapterError(f"{source}: format_version {version!r} is not a valid adapter format; the adapter is damaged.")
    if version > FORMAT_VERSION:
        raise AdapterError(
            f"{source} uses adapter format {version}, written by a newer bitfit-hf; this version ({__version__}) "
            f"reads formats up to {FORMAT_VERSION}. Upgrade bitfit-hf (pip install -U bitfit-hf) to load it."
        )


_FIELD_TYPES = {
    "base_model_name_or_path": str, "model_type": str, "architecture": str, "base_fingerprint": str,
    "bias_terms": list, "patterns": list, "train_head": bool, "head_modules": list, "add_missing_biases": bool,
    "added_biases": dict, "method": str, "method_config": dict, "dtype": str, "metadata": dict,
}
_OPTIONAL_TYPES = {"base_model_revision": str, "task_type": str, "num_labels": int, "id2label": dict,
                   "label2id": dict, "problem_type": str, "tensors_sha256": str,
                   "sentence_pooling": str}


def _check_field_types(config: "AdapterConfig", source: str) -> None:
    """A damaged or hand-edited config fails here, by name, instead of somewhere deep in a load."""
    for name, kind in [*_FIELD_TYPES.items(), *_OPTIONAL_TYPES.items()]:
        value = getattr(config, name)
        if value is None and name in _OPTIONAL_TYPES:
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise AdapterError(
                f"{source}: field {name!r} should be a {kind.__name__}, found {type(value).__name__}; the adapter "
                "is damaged — save or download it again."
            )
