"""Claim 1 from model configurations alone: what fraction of BERT-base / BERT-large / RoBERTa-base
BitFit trains.

Each model is built from transformers' config class with the published sizes on the ``meta`` device
(shapes, no memory, no weights to download), and the biases are counted through the same role tables
and selection code that training uses, so the figure is the library's, not a hand-written formula.
The fraction is bias parameters over all parameters of the encoder without a task head, as the paper
reports it.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

__all__ = ["PUBLISHED_CONFIGS", "count_bias_fraction", "count_published_models"]


def _bert_base():
    from transformers import BertConfig

    return BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                      vocab_size=30522, max_position_embeddings=512, type_vocab_size=2)


def _bert_large():
    from transformers import BertConfig

    return BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                      vocab_size=30522, max_position_embeddings=512, type_vocab_size=2)


def _roberta_base():
    from transformers import RobertaConfig

    return RobertaConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                         vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1)


#: name -> config factory, with the sizes of the published checkpoints (bert-base-uncased,
#: bert-large-uncased, roberta-base).
PUBLISHED_CONFIGS: Dict[str, Callable] = {
    "bert-base": _bert_base,
    "bert-large": _bert_large,
    "roberta-base": _roberta_base,
}


def count_bias_fraction(config) -> Dict[str, float]:
    """Parameter counts of the bare encoder for ``config``: total, all biases, ``b_q`` + ``b_m2``."""
    import torch
    from transformers import AutoModel

    from bitfit_hf.tuners.bias.config import BitFitConfig
    from bitfit_hf.tuners.bias.selection import resolve
    from bitfit_hf.tuners.summary import TrainableSummary

    with torch.device("meta"):
        model = AutoModel.from_config(config)
    counts: Dict[str, float] = {}
    for key, preset in (("all", "all"), ("paper_subset", "paper-subset")):
        summary = TrainableSummary.from_selection(resolve(model, BitFitConfig(preset, train_head=False)))
        counts["total_params"] = summary.total_params
        counts[f"{key}_bias_params"] = summary.bias_params
        counts[f"{key}_percent"] = 100.0 * summary.bias_fraction
    return counts


def count_published_models(extra: Optional[Dict[str, object]] = None) -> Dict[str, Dict[str, float]]:
    """:func:`count_bias_fraction` for every published configuration, plus ``extra`` (name -> config)."""
    configs = {name: factory() for name, factory in PUBLISHED_CONFIGS.items()}
    configs.update(extra or {})
    return {name: count_bias_fraction(config) for name, config in configs.items()}
