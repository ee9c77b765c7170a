"""What the recipes do with parts of a base that were never trained, right after loading it.

A sentence-transformers checkpoint classifies through its own pooling (``--pooling_head checkpoint``,
the default) or trains its untrained pooler with the head (``--pooling_head train_pooler``); modules the
load initialised afresh outside the task head are trained with the head. One log line says what was
chosen and why. docs/sentence-transformers.md has the measurement behind the default.
"""

from __future__ import annotations

import logging
from typing import Iterable

from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.tuners.state import detect_head_modules
from bitfit_hf.utils.sentence_pooling import (
    PoolingConfigError,
    checkpoint_pooling,
    install_sentence_pooling,
    mark_untrained_modules,
    newly_initialised_modules,
    untrained_pooler,
)

logger = logging.getLogger(__name__)


def handle_untrained_parts(model, model_args, source: str, missing_keys: Iterable[str]) -> None:
    """Apply ``--pooling_head`` to a sentence-transformers base and mark newly initialised modules as head."""
    fresh = newly_initialised_modules(model, missing_keys, exclude=detect_head_modules(model))
    if type(model).__name__.endswith("ForSequenceClassification"):
        try:
            mode = checkpoint_pooling(source, revision=model_args.model_revision, token=model_args.token)
        except PoolingConfigError as err:
            raise RecipeError(str(err)) from None
        if mode is not None:
            _use_sentence_pooling(model, mode, model_args.pooling_head, source)
    fresh = [name for name in fresh if name in dict(model.named_modules())]  # a removed pooler is gone
    if fresh:
        mark_untrained_modules(model, fresh)
        logger.warning("The load initialised %s afresh (not in the checkpoint): trained with the task head.",
                       ", ".join(fresh))


def _use_sentence_pooling(model, mode: str, pooling_head: str, source: str) -> None:
    pooler = untrained_pooler(model)
    if pooling_head == "train_pooler" and pooler is not None:
        mark_untrained_modules(model, [pooler])
        logger.info("Sentence-transformers base (%s pooling): its %s was never trained, so it is trained with the "
                    "task head (--pooling_head train_pooler; the default classifies through %s pooling, with a "
                    "smaller adapter).", mode, pooler, mode)
        return
    try:
        install_sentence_pooling(model, mode)
    except PoolingConfigError as err:
        raise RecipeError(str(err)) from None
    logger.info("Sentence-transformers base: the head classifies from the checkpoint's own %s pooling (its "
                "1_Pooling config)%s; --pooling_head train_pooler trains the pooler with the head instead.",
                mode, f", not from {pooler}, which was never trained" if pooler else "")
