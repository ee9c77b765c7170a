"""Model cards for bias-only adapter repos, built with ``huggingface_hub``'s ``ModelCard``.

The card is rendered from the Jinja template ``model_cards/bitfit_adapter.md`` (shipped in the wheel as
``bitfit_hf/model_cards/bitfit_adapter.md``). Its metadata carries ``base_model`` (with ``base_model_relation:
adapter``), ``library_name: bitfit-hf``, ``tags`` (``bitfit`` first), ``datasets``, ``license``,
``pipeline_tag`` (from the adapter's task type) and a ``model-index`` with the evaluation results; the
body says what was trained (every trained tensor by role, counts, fraction of the base), the training
hyper-parameters, the evaluation table, the bias-change heat map (the paper's Figure 1), a
copy-paste snippet that loads the adapter onto the stock base, and the BitFit citation.

Nothing here touches the network: :func:`build_model_card` works on local inputs only, and the
base checkpoint is read for the heat map only when it is a local folder or already in the Hub cache.

The evaluation results come from :mod:`bitfit_hf.reporting.eval_results`, the bias change with its files from
:mod:`bitfit_hf.reporting.bias_change_files`, the YAML metadata from :mod:`bitfit_hf.reporting.card_metadata` and
the prose from :mod:`bitfit_hf.reporting.card_sections`; this module puts them together and writes the card.
"""

from __future__ import annotations

import importlib.resources
import os
import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

from bitfit_hf.adapters.base_checkpoint import checkpoint_files, match_key, tensor_sizes
from bitfit_hf.adapters.config import AdapterConfig
from bitfit_hf.adapters.task_types import LABELLED
from bitfit_hf.reporting.bias_change_files import resolve_bias_change, write_bias_change_files
from bitfit_hf.reporting.card_metadata import (
    PIPELINE_TAGS,
    REPO_ID,
    as_list,
    build_card_data,
    hub_base_model_id,
    model_index_rows,
)
from bitfit_hf.reporting.card_sections import (
    BIAS_TERMS,
    BITFIT_CITATION,
    FILE_DESCRIPTIONS,
    bitfit_intro,
    card_method,
    dataset_text,
    file_description,
    fmt,
    hyperparameter_rows,
    method_intro,
    method_text,
    role_rows,
    selection_lines,
    trained_kinds,
    usage_example,
    vector_words,
    version_rows,
)
from bitfit_hf.reporting.eval_results import read_eval_results
from bitfit_hf.reporting.heatmap import BiasChange, classify_trained
from bitfit_hf.tuners.summary import TrainableSummary
from bitfit_hf.utils.constants import (
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


# ---- body helpers ----------------------------------------------------------------------------------


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


# ---- body helpers ----------------------------------------------------------------------------------


def summary_from_adapter(adapter, total_params: Optional[int] = None) -> dict:
    """``trainable_summary.json`` rebuilt from the adapter alone (same keys as ``TrainableSummary``): every trained
    tensor by role (:func:`~bitfit_hf.reporting.heatmap.classify_trained`: biases, norm gains, a method's own
    tensors, ...), then the head.

    ``total_params`` (the task model's size, for the fractions) defaults to the size of the recorded
    base checkpoint when it is a local folder or in the Hub cache, plus the head; else 0 (unknown).
    """
    cfg = adapter.config
    per_role: Dict[str, int] = {}
    tensors: Dict[str, int] = {}
    per_layer: Dict[str, Dict[str, int]] = {}
    for _name, role, layer, numel in classify_trained(adapter):
        per_role[role] = per_role.get(role, 0) + numel
        tensors[role] = tensors.get(role, 0) + 1
        layers = per_layer.setdefault(role, {})
        layers[layer] = layers.get(layer, 0) + numel
    head = [n for n in cfg.trained_parameters if is_under(n, cfg.head_modules)]
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


# ---- body helpers ----------------------------------------------------------------------------------


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
    named = as_list(dataset if dataset is not None else meta.get("dataset") or meta.get("datasets"))
    datasets = [d for d in named if REPO_ID.fullmatch(d)]  # Hub dataset ids go to the metadata
    dataset_name = dataset_name or next((d for d in named if d not in datasets), None)
    license = license or meta.get("license") or ("apache-2.0" if base_id == DEFAULT_MODEL_ID else None)
    language = language if language is not None else meta.get("language")
    if eval_results is None:
        eval_results = meta.get("eval_results")

    spec = card_method(cfg)
    model_index, rows = model_index_rows(cfg, eval_results, pipeline_tag, datasets, dataset_name, dataset_config)
    card_data = build_card_data(cfg, spec, base_id, pipeline_tag, tags, datasets, license, language,
                           title if model_index else None, model_index)

    # body
    summary = dict(summary) if summary else summary_from_adapter(adapter)
    total = int(summary.get("total_params") or 0)
    per_role = dict(summary.get("per_role") or {})
    head_params = int(per_role.get("head", 0)) if cfg.train_head else 0
    bias_params = int(summary.get("bias_params", sum(v for k, v in per_role.items() if k != "head")))
    summary_rows = role_rows(cfg, summary)
    kinds = trained_kinds(per_role)
    trained_words, parameter_words = vector_words(kinds)
    bias_only = trained_words == BIAS_TERMS
    if isinstance(bias_change, Mapping):
        bias_change = BiasChange.from_dict(bias_change)
    base_for_snippet = base_id or cfg.base_model_name_or_path or "BASE-MODEL-ID"
    size = weights_size
    file_list = list(files) if files is not None else [WEIGHTS_NAME, CONFIG_NAME, README_NAME]
    template_kwargs = dict(
        title=title,
        intro=(bitfit_intro(cfg, base_id, bias_params, total, size, kinds) if spec is None
               else method_intro(cfg, spec, base_id, bias_params, total, size)),
        method_text=method_text(cfg, spec, bias_params, head_params, total) if spec is not None else "",
        train_head=cfg.train_head,
        sparse_entries=bool(cfg.sparse_parameters),
        bias_params=bias_params,
        head_params=head_params,
        total_params=total,
        bias_fraction_text=f"{100 * bias_params / total:.4f}%" if total else "",
        train_summary_rows=summary_rows,
        role_header="bias type" if bias_only else "role",
        trained_words=trained_words,
        parameter_words=parameter_words,
        selection_lines=selection_lines(cfg),
        repo_id=repo_id,
        base_for_snippet=base_for_snippet,
        base_override=base_id is not None and base_id != cfg.base_model_name_or_path,
        architecture=cfg.architecture or "AutoModel",
        model_kwargs=f", num_labels={cfg.num_labels}" if cfg.num_labels and cfg.task_type in LABELLED else "",
        peft_subfolder=PEFT_SUBFOLDER if f"{PEFT_SUBFOLDER}/{CONFIG_NAME}" in file_list else None,
        usage_example=usage_example(cfg),
        hyperparameters=hyperparameter_rows(meta.get("training_args"), hyperparameters),
        eval_rows=[{"split": s, "metric": m, "value": fmt(v)} for s, m, v in rows],
        dataset_text=dataset_text(datasets, dataset_name, dataset_config),
        heatmap_file=heatmap_file,
        bias_change_table=bias_change.to_markdown() if bias_change is not None and bias_change.roles else "",
        outside_layers=[(k, fmt(v)) for k, v in bias_change.outside_layers.items()] if bias_change is not None else [],
        files=[(name, file_description(name, cfg, bias_only)) for name in sorted(set(file_list))],
        versions=version_rows(cfg),
        citation=spec.citation if spec is not None and spec.citation else BITFIT_CITATION,
    )
    card = ModelCard.from_template(card_data, template_path=template_path(), **template_kwargs)
    card.text = re.sub(r"\n{3,}", "\n\n", card.text).strip() + "\n"
    return ModelCard(str(card))


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
