"""The model card's YAML metadata: ``base_model``, tags, ``pipeline_tag`` and the ``model-index`` of results.

Kept apart from the card's prose (:mod:`bitfit_hf.reporting.card_sections`) because the Hub reads this part:
it decides how the repo is listed, linked to its base and searched, so its values follow the Hub's
vocabulary (pipeline tags, repo ids, ``EvalResult`` fields) rather than the reader's.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

from bitfit_hf.adapters.config import AdapterConfig
from bitfit_hf.adapters.task_types import CAUSAL_LM, MASKED_LM, MULTIPLE_CHOICE, QUESTION_ANS, SEQ_2_SEQ_LM, SEQ_CLS, TOKEN_CLS
from bitfit_hf.reporting.eval_results import BEFORE_TRAINING, eval_rows

PIPELINE_TAGS = {
    SEQ_CLS: "text-classification",
    TOKEN_CLS: "token-classification",
    QUESTION_ANS: "question-answering",
    CAUSAL_LM: "text-generation",
    MASKED_LM: "fill-mask",
    SEQ_2_SEQ_LM: "text2text-generation",
    MULTIPLE_CHOICE: None,  # the Hub has no multiple-choice pipeline
}
TASK_WORDS = {
    SEQ_CLS: "text classification",
    TOKEN_CLS: "token classification",
    QUESTION_ANS: "extractive question answering",
    CAUSAL_LM: "causal language modelling",
    MASKED_LM: "masked language modelling",
    SEQ_2_SEQ_LM: "sequence-to-sequence generation",
    MULTIPLE_CHOICE: "multiple choice",
}

#: A Hub repo id (``name`` or ``owner/name``): what may go into the metadata as a model or dataset id.
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _known_local_bases() -> Dict[str, str]:
    """Local folders of registry-installed models and the Hub ids they mirror."""
    from bitfit_hf.data.assets import MODEL_ASSETS, model_path

    known = {}
    for spec in MODEL_ASSETS.values():
        if not spec.hub_id:
            continue
        try:
            known[os.path.realpath(model_path(spec.name, fetch=False))] = spec.hub_id
        except Exception:  # noqa: BLE001 - the assets are optional
            pass
    return known


def hub_base_model_id(config: AdapterConfig, override: Optional[str] = None) -> Optional[str]:
    """The Hub id of the adapter's base model, or ``None`` when it records only a local path.

    ``override`` wins; a local folder of a known registry-installed model maps to its Hub id.
    """
    if override:
        return override
    name = config.base_model_name_or_path or ""
    if not name:
        return None
    if os.path.exists(name):
        return _known_local_bases().get(os.path.realpath(name))
    if name.startswith((".", "/", "~")) or "\\" in name or not REPO_ID.fullmatch(name) or name.count("/") > 1:
        return None
    return name


def model_index_rows(cfg: AdapterConfig, eval_results, pipeline_tag, datasets: List[str], dataset_name, dataset_config):
    """The card's ``model-index`` entries and the (split, metric, value) rows of its results table."""
    from huggingface_hub import EvalResult

    if isinstance(eval_results, list) and all(isinstance(r, EvalResult) for r in eval_results):
        rows = [(r.dataset_split or "", r.metric_name or r.metric_type, float(r.metric_value)) for r in eval_results]
        return list(eval_results), rows
    if not eval_results:
        return [], []
    rows = eval_rows(eval_results)
    shown_dataset = dataset_name or (datasets[0] if datasets else "evaluation set")
    model_index: List[Any] = []
    for split, metric, value in rows:
        if metric == "loss" or split == "train" or split.endswith(BEFORE_TRAINING):
            continue
        model_index.append(
            EvalResult(
                task_type=pipeline_tag or (cfg.task_type or "other").lower().replace("_", "-"),
                task_name=TASK_WORDS.get(cfg.task_type or "", None),
                dataset_type=datasets[0] if datasets else "custom",
                dataset_name=shown_dataset,
                dataset_config=dataset_config,
                dataset_split=split,
                metric_type=metric,
                metric_name=metric.replace("_", " ").title() if metric.islower() else metric,
                metric_value=_plain(value),
            )
        )
    return model_index, rows


def build_card_data(cfg: AdapterConfig, spec, base_id, pipeline_tag, tags, datasets, license, language, model_name,
                    model_index):
    """The card's YAML metadata (``spec``: the method when it is not plain BitFit)."""
    from huggingface_hub import ModelCardData

    all_tags = (["bitfit", "bias-only-fine-tuning", "parameter-efficient-fine-tuning"] if spec is None
                else [cfg.method, "parameter-efficient-fine-tuning"])
    for tag in [cfg.model_type, pipeline_tag, *as_list(tags)]:
        if tag and tag not in all_tags:
            all_tags.append(tag)
    extra = {"base_model_relation": "adapter"} if base_id else {}
    return ModelCardData(
        base_model=base_id,
        library_name="bitfit-hf",
        tags=all_tags,
        datasets=datasets or None,
        license=license,
        language=language,
        pipeline_tag=pipeline_tag,
        model_name=model_name,
        eval_results=model_index or None,
        **extra,
    )


def as_list(value) -> List[str]:
    """A metadata field given as one string or several, as a list (``None`` and ``""``: empty)."""
    if value is None or value == "":
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _plain(value: float):
    return int(value) if float(value).is_integer() and abs(value) > 1 else float(f"{value:.6g}")

