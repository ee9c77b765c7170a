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
from bitfit_hf.training.pooling_head import apply_pooling_head
from bitfit_hf.tuners.state import detect_head_modules
from bitfit_hf.utils.sentence_pooling import PoolingConfigError, mark_untrained_modules, newly_initialised_modules

logger = logging.getLogger(__name__)


def handle_untrained_parts(model, model_args, source: str, missing_keys: Iterable[str]) -> None:
    """Apply ``--pooling_head`` to a sentence-transformers base and mark newly initialised modules as head."""
    fresh = newly_initialised_modules(model, missing_keys, exclude=detect_head_modules(model))
    try:
        apply_pooling_head(model, source, model_args.pooling_head, revision=model_args.model_revision,
                           token=model_args.token)
    except PoolingConfigError as err:
        raise RecipeError(str(err)) from None
    fresh = [name for name in fresh if name in dict(model.named_modules())]  # a removed pooler is gone
    if fresh:
        mark_untrained_modules(model, fresh)
        logger.warning("The load initialised %s afresh (not in the checkpoint): trained with the task head.",
                       ", ".join(fresh))
