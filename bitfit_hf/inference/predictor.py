"""In-process answers: a model and its tokenizer over a list of items, batched, through the same features,
padding and answers as the server. ``bitfit-hf predict`` uses it; so can any script."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from bitfit_hf.adapters.task_types import ANSWERED, QUESTION_ANS
from bitfit_hf.inference.answers import answer
from bitfit_hf.inference.batches import collate, per_row
from bitfit_hf.inference.inputs import DOC_STRIDE, Feature, Limit, encode, length_limit


def pad_id_of(tokenizer) -> int:
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    return int(pad)


class Predictor:
    """``Predictor(model, tokenizer, task).predict(items)`` -> one answer per item (see
    :mod:`bitfit_hf.inference.answers`). ``max_length``: the wished limit, lowered to what the tokenizer and
    the model take (``self.limit`` says which bound applies)."""

    def __init__(self, model, tokenizer, task: str, max_length: Optional[int] = None, batch_size: int = 16,
                 doc_stride: int = DOC_STRIDE):
        if task not in ANSWERED:
            raise ValueError(f"no answers are defined for {task!r}; tasks: {', '.join(ANSWERED)}.")
        self.model, self.tokenizer, self.task = model, tokenizer, task
        self.limit: Limit = length_limit(max_length, tokenizer, getattr(model, "config", None))
        self.batch_size, self.doc_stride = batch_size, doc_stride
        config = model.config
        self.id2label = {int(k): v for k, v in (getattr(config, "id2label", None) or {}).items()}
        self.problem_type = getattr(config, "problem_type", None)

    def features(self, items: Sequence[Any], truncate: bool = True) -> List[Feature]:
        return encode(self.tokenizer, self.task, items, self.limit.tokens, truncate, self.doc_stride)

    def run(self, features: Sequence[Feature]) -> List[Any]:
        """Each feature's outputs, batched longest first (little padding), in the features' order."""
        device = next(self.model.parameters()).device
        left = getattr(self.tokenizer, "padding_side", "right") == "left"
        order = sorted(range(len(features)), key=lambda i: -features[i].length)
        outputs: List[Any] = [None] * len(features)
        with torch.no_grad():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                batch = collate([features[i] for i in chunk], pad_id_of(self.tokenizer), left, device)
                raw = self.model(**batch)
                logits = None if self.task == QUESTION_ANS else raw.logits
                for i, row in zip(chunk, per_row(logits, raw, [features[i].length for i in chunk], left)):
                    outputs[i] = row
        return outputs

    def answers(self, features: Sequence[Feature], n_items: int, **options) -> List[Any]:
        return answer(self.task, self.run(features), features, n_items, self.id2label, self.problem_type, options)

    def predict(self, items: Sequence[Any], truncate: bool = True, **options) -> List[Any]:
        """``options``: ``top_k``, ``raw_scores`` (classification), ``max_answer_len``,
        ``handle_impossible_answer``, ``top_k`` (QA)."""
        return self.answers(self.features(items, truncate), len(items), **options)

