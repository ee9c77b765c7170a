"""Model cards for bias-only adapter repos, built with ``huggingface_hub``'s ``ModelCard``.

The card is rendered from the Jinja template ``model_cards/bitfit_adapter.md`` (shipped in the wheel as
``bitfit_hf/model_cards/bitfit_adapter.md``). Its metadata carries ``base_model`` (with ``base_model_relation:
adapter``), ``library_name: bitfit-hf``, ``tags`` (``bitfit`` first), ``datasets``, ``license``,
``pipeline_tag`` (from the adapter's task type) and a ``model-index`` with the evaluation results; the
body says what was trained (bias types, counts, fraction of the base), the training
hyper-parameters, the evaluation table, the bias-change heat map (the paper's Figure 1), a
copy-paste snippet that loads the adapter onto the stock base, and the BitFit citation.

Nothing here touches the network: :func:`build_model_card` works on local inputs only, and the
base checkpoint is read for the heat map only when it is a local folder or already in the Hub cache.

The evaluation results come from :mod:`bitfit_hf.reporting.eval_results` and the bias change with its
files from :mod:`bitfit_hf.reporting.bias_change_files`; this module builds and writes the card.
"""

from __future__ import annotations

import copy
import importlib.resources
import os
import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from bitfit_hf.adapters.base_checkpoint import checkpoint_files, match_key, tensor_sizes
from bitfit_hf.adapters.config import AdapterConfig
from bitfit_hf.adapters.sparse import tensor_names
from bitfit_hf.reporting.bias_change_files import resolve_bias_change, write_bias_change_files
from bitfit_hf.reporting.eval_results import BEFORE_TRAINING, eval_rows, read_eval_results
from bitfit_hf.reporting.heatmap import BiasChange, classify
from bitfit_hf.tuners import METHODS, method_spec, tensor_role_of
from bitfit_hf.tuners.roles import ALL_ROLES, role_rank
from bitfit_hf.tuners.summary import TrainableSummary
from bitfit_hf.utils.constants import (
    BIAS_CHANGE_JSON,
    BIAS_CHANGE_PNG,
    CONFIG_NAME,
    DEFAULT_MODEL_ID,
    PEFT_SUBFOLDER,
    README_NAME,
    SUMMARY_NAME,
    WEIGHTS_NAME,
)
from bitfit_hf.utils.names import is_under
from bitfit_hf.utils.secrets import redact, redact_text

TEMPLATE_NAME = "bitfit_adapter.md"

PIPELINE_TAGS = {
    "SEQ_CLS": "text-classification",
    "TOKEN_CLS": "token-classification",
    "QUESTION_ANS": "question-answering",
    "CAUSAL_LM": "text-generation",
    "MASKED_LM": "fill-mask",
    "SEQ_2_SEQ_LM": "text2text-generation",
    "MULTIPLE_CHOICE": None,  # the Hub has no multiple-choice pipeline
}
_TASK_WORDS = {
    "SEQ_CLS": "text classification",
    "TOKEN_CLS": "token classification",
    "QUESTION_ANS": "extractive question answering",
    "CAUSAL_LM": "causal language modelling",
    "MASKED_LM": "masked language modelling",
    "SEQ_2_SEQ_LM": "sequence-to-sequence generation",
    "MULTIPLE_CHOICE": "multiple choice",
}

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

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


# ---- the template --------------------------------------------------------------------------------


def template_path() -> str:
    """The card template: ``model_cards/bitfit_adapter.md`` at the repository root, shipped in the
    wheel as ``bitfit_hf/model_cards/`` (package data reached through a symlink); a checkout whose
    symlink did not survive (Windows) falls back to the repository folder."""
    try:
        candidate = importlib.resources.files("bitfit_hf") / "model_cards" / TEMPLATE_NAME
        if candidate.is_file():
            return str(candidate)
    except (ModuleNotFoundError, TypeError, OSError):
        pass
    candidate = Path(__file__).resolve().parent.parent / "model_cards" / TEMPLATE_NAME
    if candidate.is_file():
        return str(candidate)
    raise FileNotFoundError(
        f"The model card template {TEMPLATE_NAME} is missing from this bitfit-hf install (looked in the "
        "package's model_cards/ and the source checkout's model_cards/): reinstall bitfit-hf."
    )


# ---- inputs --------------------------------------------------------------------------------------


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
    if name.startswith((".", "/", "~")) or "\\" in name or not _REPO_ID.fullmatch(name) or name.count("/") > 1:
        return None
    return name


def summary_from_adapter(adapter, total_params: Optional[int] = None) -> dict:
    """``trainable_summary.json`` rebuilt from the adapter alone (same keys as ``TrainableSummary``).

    ``total_params`` (the task model's size, for the fractions) defaults to the size of the recorded
    base checkpoint when it is a local folder or in the Hub cache, plus the head; else 0 (unknown).
    """
    cfg = adapter.config
    per_role: Dict[str, int] = {}
    tensors: Dict[str, int] = {}
    per_layer: Dict[str, Dict[str, int]] = {}
    for name, role, layer, chunk in classify(cfg):
        numel = adapter.tensors[name].numel() if name in adapter.tensors else 0
        numel = numel // chunk[1] if chunk else numel
        per_role[role] = per_role.get(role, 0) + numel
        tensors[role] = tensors.get(role, 0) + 1
        layers = per_layer.setdefault(role, {})
        layers[layer] = layers.get(layer, 0) + numel
    for name in cfg.sparse_parameters:  # weights trained in some entries (random baselines): count those
        numel = adapter.tensors[tensor_names(name)[0]].numel()
        role = tensor_role_of(cfg.method, name) or "sparse"
        per_role[role] = per_role.get(role, 0) + numel
        tensors[role] = tensors.get(role, 0) + 1
    heads = cfg.head_modules
    for name in cfg.trained_parameters:  # the method's own tensors (LoRA matrices, (IA)³ vectors, shifts)
        role = tensor_role_of(cfg.method, name)
        if role is not None and name in adapter.tensors and not is_under(name, heads):
            per_role[role] = per_role.get(role, 0) + adapter.tensors[name].numel()
            tensors[role] = tensors.get(role, 0) + 1
    head = [n for n in cfg.trained_parameters if is_under(n, heads)]
    if head:
        per_role["head"] = sum(adapter.tensors[n].numel() for n in head if n in adapter.tensors)
        tensors["head"] = len(head)
        per_layer["head"] = {"": per_role["head"]}
    if total_params is None:
        total_params = _base_total_params(adapter) or 0
    return TrainableSummary(total_params, per_role, tensors, per_layer).to_dict()


def _base_total_params(adapter) -> Optional[int]:
    """Parameters of the task model: the base checkpoint's (read from headers only, local or cached)
    plus the head tensors the checkpoint lacks; added biases are not counted (as in TrainableSummary)."""
    cfg = adapter.config
    source = cfg.base_model_name_or_path
    if not source:
        return None
    try:
        shapes = tensor_sizes(checkpoint_files(source, cfg.base_model_revision, None, local_files_only=True))
    except Exception:  # noqa: BLE001 - only for the fractions in the card
        return None
    added = {f"{m}.bias" for m in cfg.added_biases}
    extra = sum(t.numel() for n, t in adapter.tensors.items() if n not in added and match_key(n, shapes) is None)
    return sum(shapes.values()) + extra


# ---- the card ------------------------------------------------------------------------------------


def build_model_card(
    adapter,
    repo_id: Optional[str] = None,
    *,
    base_model: Optional[str] = None,
    summary: Optional[Mapping[str, Any]] = None,
    bias_change: Union[None, BiasChange, Mapping[str, Any]] = None,
    heatmap_file: Optional[str] = None,
    eval_results: Union[None, Mapping[str, Any], List[Any]] = None,
    dataset: Union[None, str, List[str]] = None,
    dataset_name: Optional[str] = None,
    dataset_config: Optional[str] = None,
    license: Optional[str] = None,
    language: Union[None, str, List[str]] = None,
    tags: Union[None, str, List[str]] = None,
    model_name: Optional[str] = None,
    hyperparameters: Optional[Mapping[str, Any]] = None,
    files: Optional[Iterable[str]] = None,
    weights_size: Optional[int] = None,
):
    """The :class:`huggingface_hub.ModelCard` of a BitFit adapter (see the module docstring).

    ``eval_results``: trainer metrics (``{"eval_accuracy": 0.91, ...}``), ``{split: {metric: value}}``
    or a list of ``huggingface_hub.EvalResult``; default: ``adapter.config.metadata["eval_results"]``.
    ``dataset``: Hub dataset id(s) for the ``datasets`` metadata; ``dataset_name``: a readable name
    for the model-index (default: the first dataset id, else ``"evaluation set"``).
    """
    from huggingface_hub import ModelCard

    cfg: AdapterConfig = adapter.config
    meta = redact(dict(cfg.metadata or {}))  # a card is published: never a credential in it
    base_id = hub_base_model_id(cfg, base_model)
    pipeline_tag = PIPELINE_TAGS.get(cfg.task_type or "")
    repo_id = repo_id or meta.get("hub_model_id")
    title = model_name or (repo_id.split("/")[-1] if repo_id else "bitfit-adapter")
    repo_id = repo_id or f"your-name/{title}"  # a local card: the snippet shows where the id goes
    named = _as_list(dataset if dataset is not None else meta.get("dataset") or meta.get("datasets"))
    datasets = [d for d in named if _REPO_ID.fullmatch(d)]  # Hub dataset ids go to the metadata
    dataset_name = dataset_name or next((d for d in named if d not in datasets), None)
    license = license or meta.get("license") or ("apache-2.0" if base_id == DEFAULT_MODEL_ID else None)
    language = language if language is not None else meta.get("language")
    if eval_results is None:
        eval_results = meta.get("eval_results")

    spec = _method(cfg)
    model_index, rows = _model_index(cfg, eval_results, pipeline_tag, datasets, dataset_name, dataset_config)
    card_data = _card_data(cfg, spec, base_id, pipeline_tag, tags, datasets, license, language,
                           title if model_index else None, model_index)

    # body
    summary = dict(summary) if summary else summary_from_adapter(adapter)
    total = int(summary.get("total_params") or 0)
    per_role = dict(summary.get("per_role") or {})
    head_params = int(per_role.get("head", 0)) if cfg.train_head else 0
    bias_params = int(summary.get("bias_params", sum(v for k, v in per_role.items() if k != "head")))
    summary_rows = _summary_rows(cfg, summary)
    if isinstance(bias_change, Mapping):
        bias_change = BiasChange.from_dict(bias_change)
    base_for_snippet = base_id or cfg.base_model_name_or_path or "BASE-MODEL-ID"
    size = weights_size
    file_list = list(files) if files is not None else [WEIGHTS_NAME, CONFIG_NAME, README_NAME]
    template_kwargs = dict(
        title=title,
        intro=_intro(cfg, base_id, bias_params, total, size) if spec is None else _method_intro(cfg, spec, base_id, bias_params, total, size),
        method_text=_method_text(cfg, spec, bias_params, head_params, total) if spec is not None else "",
        train_head=cfg.train_head,
        sparse_entries=bool(cfg.sparse_parameters),
        bias_params=bias_params,
        head_params=head_params,
        total_params=total,
        bias_fraction_text=f"{100 * bias_params / total:.4f}%" if total else "",
        train_summary_rows=summary_rows,
        selection_lines=_selection_lines(cfg),
        repo_id=repo_id,
        base_for_snippet=base_for_snippet,
        base_override=base_id is not None and base_id != cfg.base_model_name_or_path,
        architecture=cfg.architecture or "AutoModel",
        model_kwargs=f", num_labels={cfg.num_labels}" if cfg.num_labels and cfg.task_type in ("SEQ_CLS", "TOKEN_CLS") else "",
        peft_subfolder=PEFT_SUBFOLDER if f"{PEFT_SUBFOLDER}/{CONFIG_NAME}" in file_list else None,
        usage_example=_usage(cfg),
        hyperparameters=_hyperparameters(meta.get("training_args"), hyperparameters),
        eval_rows=[{"split": s, "metric": m, "value": _fmt(v)} for s, m, v in rows],
        dataset_text=_dataset_text(datasets, dataset_name, dataset_config),
        heatmap_file=heatmap_file,
        bias_change_table=bias_change.to_markdown() if bias_change is not None and bias_change.roles else "",
        outside_layers=[(k, _fmt(v)) for k, v in bias_change.outside_layers.items()] if bias_change is not None else [],
        files=[(name, _file_description(name, cfg)) for name in sorted(set(file_list))],
        versions=_versions(cfg),
        citation=spec.citation if spec is not None and spec.citation else BITFIT_CITATION,
    )
    card = ModelCard.from_template(card_data, template_path=template_path(), **template_kwargs)
    card.text = re.sub(r"\n{3,}", "\n\n", card.text).strip() + "\n"
    return ModelCard(str(card))


def _model_index(cfg: AdapterConfig, eval_results, pipeline_tag, datasets: List[str], dataset_name, dataset_config):
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
                task_name=_TASK_WORDS.get(cfg.task_type or "", None),
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


def _card_data(cfg: AdapterConfig, spec, base_id, pipeline_tag, tags, datasets, license, language, model_name, model_index):
    """The card's YAML metadata (``spec``: the method when it is not plain BitFit)."""
    from huggingface_hub import ModelCardData

    all_tags = (["bitfit", "bias-only-fine-tuning", "parameter-efficient-fine-tuning"] if spec is None
                else [cfg.method, "parameter-efficient-fine-tuning"])
    for tag in [cfg.model_type, pipeline_tag, *_as_list(tags)]:
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


def _summary_rows(cfg: AdapterConfig, summary: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """One row per trained role for the card's "what is trained" table."""
    total = int(summary.get("total_params") or 0)
    per_role = dict(summary.get("per_role") or {})
    tensors = dict(summary.get("tensors_per_role") or {})
    rows = []
    for role in sorted(per_role, key=lambda r: role_rank(r, _method_role_texts())):
        what = _method_role_texts().get(role) or ALL_ROLES.get(role) or {"head": "task head (" + ", ".join(f"`{m}`" for m in cfg.head_modules) + ")",
                                       "bias": "other bias", "pattern": "selected by a pattern",
                                       "gain": "other norm gain", "sparse": "entries of weight matrices"}.get(role, role)
        rows.append({
            "role": role, "what": what, "tensors": tensors.get(role, ""), "params": int(per_role[role]),
            "percent": f"{100 * per_role[role] / total:.4f}%" if total else "",
        })
    return rows


def write_model_card_files(
    directory: str,
    adapter,
    repo_id: Optional[str] = None,
    *,
    base=None,
    bias_change: Union[None, BiasChange, Mapping[str, Any]] = None,
    summary: Optional[Mapping[str, Any]] = None,
    eval_results=None,
    heatmap: bool = True,
    **card_kwargs,
) -> List[str]:
    """Write ``README.md`` (and ``bias_change.json`` / ``bias_change.png``) for ``adapter`` into
    ``directory``; returns the names written.

    The bias change is taken from ``bias_change``, else computed against ``base`` (a model, a dict of
    its biases, or a checkpoint path / Hub id), else read from ``directory/bias_change.json``, else
    computed against the adapter's recorded base when that is a local folder or already in the Hub
    cache. Without any of these, or without matplotlib, the card simply has no heat map.
    """
    from bitfit_hf.utils.io import read_json_object, write_text_atomic

    change = resolve_bias_change(adapter, directory, base=base, bias_change=bias_change) if heatmap else None
    written = write_bias_change_files(directory, change, adapter.config, repo_id)
    if summary is None:
        summary = read_json_object(os.path.join(directory, SUMMARY_NAME))
    if eval_results is None:
        eval_results = read_eval_results(directory) or None
    present = [n for n in FILE_DESCRIPTIONS if os.path.isfile(os.path.join(directory, n))] + [README_NAME]
    weights = os.path.join(directory, WEIGHTS_NAME)
    card = build_model_card(
        adapter,
        repo_id,
        summary=summary,
        bias_change=change,
        heatmap_file=BIAS_CHANGE_PNG if BIAS_CHANGE_PNG in written else None,
        eval_results=eval_results,
        files=present,
        weights_size=os.path.getsize(weights) if os.path.isfile(weights) else None,
        **card_kwargs,
    )
    write_text_atomic(os.path.join(directory, README_NAME), redact_text(str(card)))
    return written + [README_NAME]


# ---- body helpers ----------------------------------------------------------------------------------


def _file_description(name: str, cfg: AdapterConfig) -> str:
    if name == WEIGHTS_NAME and cfg.sparse_parameters:
        return "the trained weight entries (indices and values) and the task head (safetensors; the adapter config is embedded in its header)"
    return FILE_DESCRIPTIONS.get(name, "")


def _intro(cfg: AdapterConfig, base_id: Optional[str], bias_params: int, total: int, size: Optional[int]) -> str:
    base = f"[`{base_id}`](https://huggingface.co/{base_id})" if base_id else f"`{cfg.base_model_name_or_path or 'its base model'}`"
    task = _TASK_WORDS.get(cfg.task_type or "", "")
    head = f"`{cfg.architecture}`" + (f", {task}" if task else "")
    text = (
        f"A **BitFit** adapter for {base} ({head}): bias-only fine-tuning "
        "([Ben Zaken et al., ACL 2022](https://aclanthology.org/2022.acl-short.1)), made with "
        "[bitfit-hf](https://pypi.org/project/bitfit-hf/). The repo holds only the fine-tuned bias terms"
        f"{' and the task head' if cfg.head_modules else ''}"
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
        what = "weight entries" if cfg.sparse_parameters else "bias parameters"
        bits.append(f"{bias_params:,} {what}" + (f", {100 * bias_params / total:.3f}% of the base" if total else ""))
    if size:
        bits.append(f"{human_size(size)} in all")
    text += (" (" + "; ".join(bits) + ")" if bits else "") + "; the frozen base weights come from the base model's own repo."
    if cfg.id2label:
        labels = [cfg.id2label[k] for k in sorted(cfg.id2label, key=lambda k: int(k) if str(k).isdigit() else k)]
        shown = ", ".join(f"`{x}`" for x in labels[:20]) + (f", ... ({len(labels)} in all)" if len(labels) > 20 else "")
        text += f"\n\nLabels: {shown}."
    return text


def _method_role_texts() -> Dict[str, str]:
    """Descriptions of the roles that methods other than BitFit add (AdapterBias's ``ab_v``, ...)."""
    return {role: text for spec in METHODS.values()
            for role, text in (getattr(spec.config_class, "role_descriptions", None) or {}).items()}


def _method(cfg: AdapterConfig):
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


def _method_intro(cfg: AdapterConfig, spec, base_id: Optional[str], trained: int, total: int, size: Optional[int]) -> str:
    base = f"[`{base_id}`](https://huggingface.co/{base_id})" if base_id else f"`{cfg.base_model_name_or_path or 'its base model'}`"
    task = _TASK_WORDS.get(cfg.task_type or "", "")
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


def _method_text(cfg: AdapterConfig, spec, trained: int, head_params: int, total: int) -> str:
    name = spec.display_name or cfg.method
    text = (f"{name} freezes the base model and trains {spec.description or 'the tensors below'}. This adapter trains "
            f"**{trained:,} parameters** outside the head" + (f" ({100 * trained / total:.4f}% of the base's {total:,})" if total else ""))
    if head_params:
        text += f" and **{head_params:,} task-head parameters**"
    text += "."
    if spec.not_mergeable:
        text += f" It cannot be merged into a plain checkpoint: {spec.not_mergeable}."
    return text


def _dataset_text(datasets: List[str], name: Optional[str], config: Optional[str]) -> str:
    ids = ", ".join(f"[`{d}`](https://huggingface.co/datasets/{d})" if _REPO_ID.fullmatch(d) else f"`{d}`" for d in datasets)
    if config:
        ids += f" (config `{config}`)"
    if name and ids:
        return f"{name} ({ids})"
    return name or ids


def _selection_lines(cfg: AdapterConfig) -> List[str]:
    lines = [f"bias terms: `{' '.join(cfg.bias_terms)}`"]
    if cfg.sparse_parameters:
        seed = cfg.method_config.get("random_seed")
        lines = [f"random entries of {len(cfg.sparse_parameters)} weight matrices ({cfg.method}"
                 + (f", random_seed {seed}" if seed is not None else "")
                 + f"), as many as the bias terms `{' '.join(cfg.bias_terms)}`"]
    elif cfg.method_config:  # a method's own fields (BitFit has none beyond the bias terms)
        lines = ["method settings: " + ", ".join(f"`{k}={v}`" for k, v in sorted(cfg.method_config.items()))]
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


def _usage(cfg: AdapterConfig) -> str:
    task = cfg.task_type
    if task == "SEQ_CLS":
        return ('inputs = tokenizer("A gripping, beautifully acted film.", return_tensors="pt")\n'
                "label_id = model(**inputs).logits.argmax(-1).item()\n"
                "print(model.config.id2label[label_id])")
    if task == "TOKEN_CLS":
        return ('inputs = tokenizer("Pierre Vinken will join the board.", return_tensors="pt")\n'
                "ids = model(**inputs).logits.argmax(-1)[0].tolist()\n"
                "print([model.config.id2label[i] for i in ids])")
    if task == "QUESTION_ANS":
        return ('inputs = tokenizer("Who joins the board?", "Pierre Vinken will join the board.", return_tensors="pt")\n'
                "out = model(**inputs)\n"
                "start, end = out.start_logits.argmax(), out.end_logits.argmax()\n"
                "print(tokenizer.decode(inputs.input_ids[0, start : end + 1]))")
    if task in ("CAUSAL_LM", "SEQ_2_SEQ_LM"):
        return ('inputs = tokenizer("The movie was", return_tensors="pt")\n'
                "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=20)[0]))")
    return 'outputs = model(**tokenizer("Hello world", return_tensors="pt"))'


def _hyperparameters(training_args: Optional[Mapping[str, Any]], extra: Optional[Mapping[str, Any]]) -> List[Tuple[str, str]]:
    merged = dict(training_args or {})
    merged.update(extra or {})
    secret = re.compile(r"token|secret|password|key", re.IGNORECASE)
    return [(k, f"{v:g}" if isinstance(v, float) else _fmt(v)) for k, v in merged.items()
            if v is not None and not secret.search(k)]


def _versions(cfg: AdapterConfig) -> List[Tuple[str, str]]:
    import huggingface_hub
    import torch
    import transformers

    from bitfit_hf.utils.constants import __version__

    out = [("bitfit-hf", cfg.library_version or __version__)]
    out += [("transformers", transformers.__version__), ("torch", torch.__version__.split("+")[0]),
            ("huggingface_hub", huggingface_hub.__version__)]
    return out


def _as_list(value) -> List[str]:
    if value is None or value == "":
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _plain(value: float):
    return int(value) if float(value).is_integer() and abs(value) > 1 else float(f"{value:.6g}")


def _fmt(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4f}" if 1e-3 <= abs(value) < 1e4 else f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value).replace("|", "\\|")


def human_size(size: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:,} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)
