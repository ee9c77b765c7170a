"""The model card's prose: the intro, what was trained, the selection, the usage snippet, hyper-parameters,
file list, versions and citation, as the text and rows the template ``model_cards/bitfit_adapter.md`` fills in.

Kept apart from the YAML metadata (:mod:`bitfit_hf.reporting.card_metadata`) because this part is written for a
reader and changes with each method's wording, while the metadata follows the Hub's fixed vocabulary.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from bitfit_hf.adapters.config import AdapterConfig
from bitfit_hf.adapters.task_types import CAUSAL_LM, QUESTION_ANS, SEQ_2_SEQ_LM, SEQ_CLS, TOKEN_CLS
from bitfit_hf.reporting.card_metadata import REPO_ID, TASK_WORDS
from bitfit_hf.tuners import METHODS, bias_terms_of, method_spec
from bitfit_hf.tuners.roles import ALL_ROLES, GAIN_ROLES, HEAD, role_rank
from bitfit_hf.utils.constants import (
    BIAS_CHANGE_JSON,
    BIAS_CHANGE_PNG,
    CONFIG_NAME,
    PEFT_SUBFOLDER,
    README_NAME,
    SUMMARY_NAME,
    WEIGHTS_NAME,
)

BITFIT_CITATION = """@inproceedings{ben-zaken-etal-2022-bitfit,
    title = "{B}it{F}it: Simple Parameter-efficient Fine-tuning for Transformer-based Masked Language-models",
    author = "Ben Zaken, Elad  and
      Goldberg, Yoav  and
      Ravfogel, Shauli",
    booktitle = "Proceedings of the 60th Annual Meeting of the Association for Computational Linguistics (Volume 2: Short Papers)",
    month = may,
    year = "2022",
    address = "Dublin, Ireland",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2022.acl-short.1",
    doi = "10.18653/v1/2022.acl-short.1",
    pages = "1--9",
}"""


FILE_DESCRIPTIONS = {
    WEIGHTS_NAME: "the trained bias vectors and the task head (safetensors; the adapter config is embedded in its header)",
    CONFIG_NAME: "what was trained and on which base (base model, architecture, base-weights fingerprint, labels)",
    SUMMARY_NAME: "trainable parameter counts per bias type and layer",
    BIAS_CHANGE_JSON: "the bias-change matrix behind the heat map",
    BIAS_CHANGE_PNG: "the bias-change heat map",
    README_NAME: "this model card",
    f"{PEFT_SUBFOLDER}/{CONFIG_NAME}": "the same adapter as a PEFT adapter (BitFit: BEFT bias deltas on Linear layers; "
                                       "(IA)³: peft's IA3 vectors; norms and head as saved modules), for plain `peft`",
    f"{PEFT_SUBFOLDER}/{WEIGHTS_NAME}": "the PEFT copy's tensors",
}


def file_description(name: str, cfg: AdapterConfig, bias_only: bool = True) -> str:
    """The files table's line for ``name``: the weights hold bias vectors only where nothing else was trained (a
    random baseline's hold weight entries)."""
    if name == WEIGHTS_NAME and cfg.sparse_parameters:
        return "the trained weight entries (indices and values) and the task head (safetensors; the adapter config is embedded in its header)"
    if not bias_only and name == WEIGHTS_NAME:
        return "the trained tensors and the task head (safetensors; the adapter config is embedded in its header)"
    if not bias_only and name == SUMMARY_NAME:
        return "trainable parameter counts per role and layer"
    return FILE_DESCRIPTIONS.get(name, "")


BIAS_TERMS, NORM_GAINS, BY_PATTERN, OTHER_TENSORS = "bias terms", "norm gains", "tensors selected by patterns", "other tensors"


def trained_kinds(per_role: Mapping[str, Any]) -> List[str]:
    """What a summary's roles outside the head are, in words: bias terms, norm gains (LayerNorm / RMSNorm), what
    patterns selected, then anything else (a method's own tensors)."""
    found = set()
    for role in per_role:
        if role == HEAD:
            continue
        if role in GAIN_ROLES or role == "gain":
            found.add(NORM_GAINS)
        elif role in ALL_ROLES or role == "bias":
            found.add(BIAS_TERMS)
        else:
            found.add(BY_PATTERN if role == "pattern" else OTHER_TENSORS)
    return [kind for kind in (BIAS_TERMS, NORM_GAINS, BY_PATTERN, OTHER_TENSORS) if kind in found]


def vector_words(kinds: List[str]) -> Tuple[str, str]:
    """``(what is trained, what its parameters are)`` in a card's words: ("bias terms", "bias parameters") for a
    bias-only adapter (or one with nothing outside the head), ("bias terms and norm gains", "bias and gain
    parameters") for BitFit's ``one-d``, ..."""
    if kinds in ([], [BIAS_TERMS]):
        return BIAS_TERMS, "bias parameters"
    what = kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + " and " + kinds[-1]
    nouns = {BIAS_TERMS: "bias", NORM_GAINS: "gain"}
    if any(kind not in nouns for kind in kinds):
        return what, "parameters"
    return what, " and ".join(nouns[kind] for kind in kinds) + " parameters"


def role_rows(cfg: AdapterConfig, summary: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """One row per trained role for the card's "what is trained" table."""
    total = int(summary.get("total_params") or 0)
    per_role = dict(summary.get("per_role") or {})
    tensors = dict(summary.get("tensors_per_role") or {})
    rows = []
    for role in sorted(per_role, key=lambda r: role_rank(r, method_role_texts())):
        what = method_role_texts().get(role) or ALL_ROLES.get(role) or {"head": "task head (" + ", ".join(f"`{m}`" for m in cfg.head_modules) + ")",
                                       "bias": "other bias", "pattern": "selected by a pattern",
                                       "gain": "other norm gain", "weight": "other weight",
                                       "sparse": "entries of weight matrices"}.get(role, role)
        rows.append({
            "role": role, "what": what, "tensors": tensors.get(role, ""), "params": int(per_role[role]),
            "percent": f"{100 * per_role[role] / total:.4f}%" if total else "",
        })
    return rows


def method_role_texts() -> Dict[str, str]:
    """Descriptions of the roles that methods other than BitFit add (AdapterBias's ``ab_v``, ...)."""
    return {role: text for spec in METHODS.values()
            for role, text in (getattr(spec.config_class, "role_descriptions", None) or {}).items()}


def card_method(cfg: AdapterConfig):
    """The registered spec of a method with its own card text (a ``display_name``); ``None`` for the methods that
    use BitFit's card (BitFit, and the random baselines with weight entries in place of biases)."""
    if cfg.sparse_parameters:
        return None
    try:
        spec = method_spec(cfg.method)
    except ValueError:
        return None
    if not spec.display_name:
        return None
    variant = spec.card_variant(cfg.tuner_config())
    if variant is not None:
        spec = copy.copy(spec)
        spec.display_name, spec.description = variant
    return spec


def bitfit_intro(cfg: AdapterConfig, base_id: Optional[str], bias_params: int, total: int, size: Optional[int],
                 kinds: Optional[List[str]] = None) -> str:
    """The opening paragraph of a BitFit (or random-baseline) card: base, task, what the repo holds, labels.
    ``kinds``: :func:`trained_kinds` of its summary (bias terms only by default)."""
    base = f"[`{base_id}`](https://huggingface.co/{base_id})" if base_id else f"`{cfg.base_model_name_or_path or 'its base model'}`"
    task = TASK_WORDS.get(cfg.task_type or "", "")
    head = f"`{cfg.architecture}`" + (f", {task}" if task else "")
    trained, parameters = vector_words(kinds or [])
    how = "bias-only fine-tuning" if trained == BIAS_TERMS else f"BitFit-style fine-tuning of its {trained}"
    text = (
        f"A **BitFit** adapter for {base} ({head}): {how} "
        "([Ben Zaken et al., ACL 2022](https://aclanthology.org/2022.acl-short.1)), made with "
        f"[bitfit-hf](https://pypi.org/project/bitfit-hf/). The repo holds only the fine-tuned {trained}"
        + ((" and" if trained == BIAS_TERMS else " plus") + " the task head" if cfg.head_modules else "")
    )
    if cfg.sparse_parameters:  # the paper's random baselines train weight entries, not biases
        text = (
            f"A **{cfg.method}** baseline adapter for {base} ({head}): the random baseline of BitFit "
            "([Ben Zaken et al., ACL 2022](https://aclanthology.org/2022.acl-short.1)), which trains as many "
            f"randomly chosen weight entries as BitFit's `{' '.join(cfg.bias_terms)}` bias terms, made with "
            "[bitfit-hf](https://pypi.org/project/bitfit-hf/). The repo holds only those entries (indices and "
            f"values){' and the task head' if cfg.head_modules else ''}"
        )
    bits = []
    if bias_params:
        what = "weight entries" if cfg.sparse_parameters else parameters
        bits.append(f"{bias_params:,} {what}" + (f", {100 * bias_params / total:.3f}% of the base" if total else ""))
    if size:
        bits.append(f"{human_size(size)} in all")
    text += (" (" + "; ".join(bits) + ")" if bits else "") + "; the frozen base weights come from the base model's own repo."
    if cfg.id2label:
        labels = [cfg.id2label[k] for k in sorted(cfg.id2label, key=lambda k: int(k) if str(k).isdigit() else k)]
        shown = ", ".join(f"`{x}`" for x in labels[:20]) + (f", ... ({len(labels)} in all)" if len(labels) > 20 else "")
        text += f"\n\nLabels: {shown}."
    return text


def method_intro(cfg: AdapterConfig, spec, base_id: Optional[str], trained: int, total: int, size: Optional[int]) -> str:
    """The opening paragraph of a card for a method with its own card text (``spec``: :func:`card_method`)."""
    base = f"[`{base_id}`](https://huggingface.co/{base_id})" if base_id else f"`{cfg.base_model_name_or_path or 'its base model'}`"
    task = TASK_WORDS.get(cfg.task_type or "", "")
    head = f"`{cfg.architecture}`" + (f", {task}" if task else "")
    name = spec.display_name or cfg.method
    article = "An" if name[:1].upper() in "AEIOU" else "A"
    text = f"{article} **{name}** adapter for {base} ({head}), made with [bitfit-hf](https://pypi.org/project/bitfit-hf/)"
    text += f": {spec.description}." if spec.description else "."
    if spec.paper:
        text += f" Method: {spec.paper}."
    bits = [f"{trained:,} trained parameters outside the head" + (f", {100 * trained / total:.3f}% of the base" if total else "")]
    if size:
        bits.append(f"{human_size(size)} in all")
    text += " The repo holds only the trained tensors (" + "; ".join(bits) + "); the frozen base weights come from the base model's own repo."
    if cfg.id2label:
        labels = [cfg.id2label[k] for k in sorted(cfg.id2label, key=lambda k: int(k) if str(k).isdigit() else k)]
        text += "\n\nLabels: " + ", ".join(f"`{x}`" for x in labels[:20]) + (f", ... ({len(labels)} in all)" if len(labels) > 20 else "") + "."
    return text


def method_text(cfg: AdapterConfig, spec, trained: int, head_params: int, total: int) -> str:
    """The "what was trained" paragraph of such a method's card."""
    name = spec.display_name or cfg.method
    text = (f"{name} freezes the base model and trains {spec.description or 'the tensors below'}. This adapter trains "
            f"**{trained:,} parameters** outside the head" + (f" ({100 * trained / total:.4f}% of the base's {total:,})" if total else ""))
    if head_params:
        text += f" and **{head_params:,} task-head parameters**"
    text += "."
    if spec.not_mergeable:
        text += f" It cannot be merged into a plain checkpoint: {spec.not_mergeable}."
    return text


def dataset_text(datasets: List[str], name: Optional[str], config: Optional[str]) -> str:
    """The evaluation data as the card names it: the readable name, then the Hub ids linked."""
    ids = ", ".join(f"[`{d}`](https://huggingface.co/datasets/{d})" if REPO_ID.fullmatch(d) else f"`{d}`" for d in datasets)
    if config:
        ids += f" (config `{config}`)"
    if name and ids:
        return f"{name} ({ids})"
    return name or ids


def selection_lines(cfg: AdapterConfig) -> List[str]:
    """The bullet lines that say what the adapter selected: bias terms where the method has them, its settings,
    patterns, head, base."""
    terms = bias_terms_of(cfg)
    lines = []
    if cfg.sparse_parameters:
        seed = cfg.method_config.get("random_seed")
        lines = [f"random entries of {len(cfg.sparse_parameters)} weight matrices ({cfg.method}"
                 + (f", random_seed {seed}" if seed is not None else "")
                 + f"), as many as the bias terms `{' '.join(terms)}`"]
    else:
        # "frozen" beside a method's own tensors ((IA)³, LoRA alone) is no bias selection to state
        if terms and not (cfg.method_config and terms == ["frozen"]):
            lines.append(f"bias terms: `{' '.join(terms)}`")
        if cfg.method_config:  # a method's own fields (BitFit has none beyond the bias terms)
            lines.append("method settings: " + ", ".join(f"`{k}={v}`" for k, v in sorted(cfg.method_config.items())))
    if cfg.patterns:
        lines.append("extra patterns: " + ", ".join(f"`{p}`" for p in cfg.patterns))
    if cfg.head_modules:
        lines.append(("task head (trained): " if cfg.train_head else "task head (frozen, shipped): ")
                     + ", ".join(f"`{m}`" for m in cfg.head_modules))
    if cfg.sentence_pooling:
        lines.append(f"the head classifies from the base's own {cfg.sentence_pooling} pooling (its sentence-transformers "
                     "config; the never-trained pooler removed), rebuilt by every bitfit-hf loader")
    if cfg.added_biases:
        lines.append(f"{len(cfg.added_biases)} zero-initialised biases added to modules that had none")
    if cfg.base_model_revision:
        lines.append(f"base revision: `{cfg.base_model_revision}`")
    lines.append(f"base-weights fingerprint: `{cfg.base_fingerprint}`")
    return lines


def usage_example(cfg: AdapterConfig) -> str:
    """The snippet's last lines: one call that fits the adapter's task."""
    task = cfg.task_type
    if task == SEQ_CLS:
        return ('inputs = tokenizer("A gripping, beautifully acted film.", return_tensors="pt")\n'
                "label_id = model(**inputs).logits.argmax(-1).item()\n"
                "print(model.config.id2label[label_id])")
    if task == TOKEN_CLS:
        return ('inputs = tokenizer("Pierre Vinken will join the board.", return_tensors="pt")\n'
                "ids = model(**inputs).logits.argmax(-1)[0].tolist()\n"
                "print([model.config.id2label[i] for i in ids])")
    if task == QUESTION_ANS:
        return ('inputs = tokenizer("Who joins the board?", "Pierre Vinken will join the board.", return_tensors="pt")\n'
                "out = model(**inputs)\n"
                "start, end = out.start_logits.argmax(), out.end_logits.argmax()\n"
                "print(tokenizer.decode(inputs.input_ids[0, start : end + 1]))")
    if task in (CAUSAL_LM, SEQ_2_SEQ_LM):
        return ('inputs = tokenizer("The movie was", return_tensors="pt")\n'
                "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=20)[0]))")
    return 'outputs = model(**tokenizer("Hello world", return_tensors="pt"))'


def hyperparameter_rows(training_args: Optional[Mapping[str, Any]], extra: Optional[Mapping[str, Any]]) -> List[Tuple[str, str]]:
    """The hyper-parameters table: training arguments with ``extra`` on top, credential-like names left out."""
    merged = dict(training_args or {})
    merged.update(extra or {})
    secret = re.compile(r"token|secret|password|key", re.IGNORECASE)
    return [(k, f"{v:g}" if isinstance(v, float) else fmt(v)) for k, v in merged.items()
            if v is not None and not secret.search(k)]


def version_rows(cfg: AdapterConfig) -> List[Tuple[str, str]]:
    """The library versions the card states (bitfit-hf: the one that saved the adapter)."""
    import huggingface_hub
    import torch
    import transformers

    from bitfit_hf.utils.constants import __version__

    out = [("bitfit-hf", cfg.library_version or __version__)]
    out += [("transformers", transformers.__version__), ("torch", torch.__version__.split("+")[0]),
            ("huggingface_hub", huggingface_hub.__version__)]
    return out


def fmt(value) -> str:
    """A value as a markdown table cell."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4f}" if 1e-3 <= abs(value) < 1e4 else f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value).replace("|", "\\|")


def human_size(size: int) -> str:
    """A byte count in the largest unit under 1024 (bytes, KB, MB, GB)."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:,} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)
