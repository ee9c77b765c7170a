"""How a sequence classifier built on a sentence-transformers checkpoint gets its sentence vector.

Such a checkpoint (all-MiniLM-L6-v2, all-mpnet-base-v2) was trained to embed by its own pooling
(``1_Pooling/config.json``: mean, CLS, max); the ``pooler.dense`` transformers adds for classification
was never trained. Left as frozen base, BitFit classifies from noise. ``"checkpoint"`` (the default)
classifies through the checkpoint's pooling and drops the pooler; ``"train_pooler"`` trains the pooler
with the task head (a larger adapter); ``"as_loaded"`` leaves the model as the user built it.
docs/sentence-transformers.md has the measurement behind the default.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from torch import nn

from bitfit_hf.utils.sentence_pooling import (
    PoolingConfigError,
    checkpoint_pooling,
    install_sentence_pooling,
    mark_untrained_modules,
    sentence_pooling_of,
    untrained_modules,
    untrained_pooler,
)

logger = logging.getLogger(__name__)

POOLING_HEADS = ("checkpoint", "train_pooler", "as_loaded")


def pooling_already_decided(model: nn.Module) -> bool:
    """True once the head's input was chosen (pooling installed, or untrained parts marked as head)."""
    return sentence_pooling_of(model) is not None or bool(untrained_modules(model))


def apply_pooling_head(model: nn.Module, source: Optional[str], pooling_head: str = "checkpoint",
                       revision: Optional[str] = None, token: Any = None) -> Optional[str]:
    """Apply ``pooling_head`` to ``model`` if ``source`` is a sentence-transformers checkpoint; return the
    pooling mode it declares (``None`` when it is not one, or the model is no sequence classifier).

    Logs one line saying what was chosen and why. Raises :class:`PoolingConfigError` on a pooling the
    classifier cannot take or an unknown ``pooling_head``.
    """
    if pooling_head not in POOLING_HEADS:
        raise PoolingConfigError(f"pooling_head={pooling_head!r} is not one of {', '.join(POOLING_HEADS)}.")
    if not source or not type(model).__name__.endswith("ForSequenceClassification"):
        return None
    mode = checkpoint_pooling(source, revision=revision, token=token)
    if mode is None:
        return None
    pooler = untrained_pooler(model)
    if pooling_head == "as_loaded":
        logger.warning("Sentence-transformers base (%s pooling) used as loaded (pooling_head='as_loaded')%s.", mode,
                       f": its {pooler} was never trained and stays frozen" if pooler else "")
        return mode
    if pooling_head == "train_pooler" and pooler is not None:
        mark_untrained_modules(model, [pooler])
        logger.info("Sentence-transformers base (%s pooling): its %s was never trained, so it is trained with the "
                    "task head (pooling_head train_pooler; the default classifies through %s pooling, with a "
                    "smaller adapter).", mode, pooler, mode)
        return mode
    install_sentence_pooling(model, mode)
    if pooler is None:  # MPNet's classifier, for one, builds no pooler: there is nothing else to train
        logger.info("Sentence-transformers base: the head classifies from the checkpoint's own %s pooling (its "
                    "1_Pooling config); this model has no pooler, so pooling_head train_pooler would do the same.",
                    mode)
        return mode
    logger.info("Sentence-transformers base: the head classifies from the checkpoint's own %s pooling (its "
                "1_Pooling config), not from %s, which was never trained; pooling_head train_pooler trains the "
                "pooler with the head instead.", mode, pooler)
    return mode
