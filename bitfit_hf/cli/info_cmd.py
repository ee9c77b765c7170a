"""``bitfit-hf info ADAPTER``: what an adapter is, without loading any model."""

from __future__ import annotations

import argparse
import os
from typing import Dict, List, Tuple

from bitfit_hf.cli.adapter_source import add_adapter_arguments, load_adapter_files


def register(verbs) -> None:
    parser = verbs.add_parser("info", help="describe an adapter (local folder or Hub id)",
                              description="Method, base model and revision, trained roles, parameter count and "
                                          "fraction, file size and the metrics recorded with an adapter.")
    add_adapter_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    adapter, folder = load_adapter_files(args.adapter, args.revision)
    for key, value in describe(adapter, folder):
        print(f"{key:<14}{value}")
    return 0


def describe(adapter, folder: str) -> List[Tuple[str, str]]:
    """The rows ``info`` prints, as (label, text) pairs."""
    from bitfit_hf.reporting.card_sections import human_size, method_role_texts
    from bitfit_hf.reporting.model_card import summary_from_adapter
    from bitfit_hf.tuners.roles import role_rank
    from bitfit_hf.utils.constants import SUMMARY_NAME, WEIGHTS_NAME
    from bitfit_hf.utils.io import read_json_object

    cfg = adapter.config
    summary = read_json_object(os.path.join(folder, SUMMARY_NAME)) or summary_from_adapter(adapter)
    total = summary.get("total_params") or 0
    trained = summary.get("trainable_params", 0)
    fraction = f" ({100 * trained / total:.4f}% of {total:,})" if total else ""
    extra = method_role_texts()
    roles = sorted((r for r in summary.get("per_role", {}) if r != "head"), key=lambda r: role_rank(r, extra))
    head = " + head" if "head" in summary.get("per_role", {}) else ""
    labels = sorted((cfg.id2label or {}).items(), key=lambda kv: int(kv[0]))
    rows = [
        ("adapter", folder),
        ("method", method_text(adapter)),
        ("base model", cfg.base_model_name_or_path + (f" @ {cfg.base_model_revision}" if cfg.base_model_revision
                                                      else " (no revision recorded: the default branch)")),
        ("architecture", f"{cfg.architecture} ({cfg.model_type})" + (f", task {cfg.task_type}" if cfg.task_type else "")),
    ]
    if labels:
        rows.append(("labels", ", ".join(str(name) for _, name in labels)))
    if cfg.sentence_pooling:
        rows.append(("pooling", f"{cfg.sentence_pooling} (the base's sentence-transformers pooling; its pooler removed)"))
    rows += [
        ("trained roles", " ".join(roles) + head if roles else "head only" if head else "none"),
        ("parameters", f"{trained:,} trained{fraction}; {summary.get('bias_params', 0):,} outside the head"),
        ("file size", f"{human_size(os.path.getsize(os.path.join(folder, WEIGHTS_NAME)))} ({WEIGHTS_NAME}, {cfg.dtype})"),
    ]
    if cfg.added_biases:
        rows.append(("added biases", f"{len(cfg.added_biases)} modules (the base has none there)"))
    metrics = card_metrics(folder)
    rows.append(("metrics", ", ".join(f"{k} {_short(v)}" for k, v in metrics.items()) or "none recorded"))
    return rows


def method_text(adapter) -> str:
    """``bitfit (all)``; a random baseline names its entry count, reference selection and seed."""
    cfg = adapter.config
    terms = " ".join(cfg.bias_terms) + (f"; patterns {cfg.patterns}" if cfg.patterns else "")
    if cfg.sparse_parameters:
        from bitfit_hf.adapters.sparse import tensor_names

        count = sum(adapter.tensors[tensor_names(name)[0]].numel() for name in cfg.sparse_parameters)
        seed = cfg.method_config.get("random_seed")
        return (f"{cfg.method} ({count:,} weight entries in {len(cfg.sparse_parameters)} matrices, as many as "
                f"bitfit {terms}" + (f"; random_seed {seed}" if seed is not None else "") + ")")
    from bitfit_hf.tuners import describe_method

    return describe_method(cfg)  # the method's own line (Method.describe), else "<--method> (<bias terms>)"


def card_metrics(folder: str) -> Dict[str, float]:
    """Metrics of the model card's model-index, else of the run's results files."""
    from bitfit_hf.reporting.eval_results import read_eval_results
    from bitfit_hf.utils.constants import README_NAME

    readme = os.path.join(folder, README_NAME)
    if os.path.isfile(readme):
        from huggingface_hub import ModelCard

        try:
            results = ModelCard.load(readme).data.eval_results or []
        except Exception:  # noqa: BLE001 - a hand-edited card must not break `info`
            results = []
        found = {f"{r.dataset_split or 'eval'}_{r.metric_type}": float(r.metric_value) for r in results}
        if found:
            return found
    return {k: v for k, v in read_eval_results(folder).items()
            if not k.endswith(("_runtime", "_per_second", "_steps_per_second", "epoch"))}


def _short(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
