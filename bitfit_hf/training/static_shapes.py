"""Batches in a few fixed shapes, so that a compiled step (CUDA graphs under ``torch.compile``'s
``reduce-overhead`` mode) is captured once per shape and replayed, instead of compiled again for every length.

Padding each batch to its own longest example (``DataCollatorWithPadding``'s default) gives as many shapes as
there are lengths; padding everything to ``max_length`` gives one shape and wastes most of the arithmetic on
short texts. :func:`length_buckets` picks a handful of lengths in between (halving from ``max_length``), and
:class:`BucketPadding` pads each batch to the smallest one that holds it. The padding is masked: a model's
outputs for an example do not depend on the bucket (``tests/training/test_static_shapes.py``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


def length_buckets(max_length: int, count: int = 4, multiple: int = 8) -> Tuple[int, ...]:
    """``count`` lengths from ``max_length`` down, halving each time, rounded up to ``multiple`` (tensor-core
    friendly), none below ``multiple``: ``length_buckets(128) == (16, 32, 64, 128)``."""
    if max_length < 1 or count < 1 or multiple < 1:
        raise ValueError(f"length_buckets needs positive numbers (got max_length={max_length}, count={count}, "
                         f"multiple={multiple}).")
    lengths = {max_length}
    for k in range(1, count):
        lengths.add(max(multiple, math.ceil(max_length / 2 ** k / multiple) * multiple))
    return tuple(sorted(length for length in lengths if length <= max_length))


def parse_buckets(text: str) -> Tuple[int, ...]:
    """``"32,64,128"`` as sorted lengths; a clear error for anything else."""
    try:
        lengths = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--length_buckets {text!r}: give comma-separated token counts, e.g. 32,64,128.") from None
    if not lengths or lengths[0] < 1:
        raise ValueError(f"--length_buckets {text!r}: give positive token counts, e.g. 32,64,128.")
    return tuple(lengths)


class BucketPadding:
    """A padding collator (``DataCollatorWithPadding``, ``DataCollatorForTokenClassification``, or any dataclass
    collator with ``padding`` / ``max_length`` fields) that pads each batch to the smallest of ``buckets`` that
    holds its longest example. A batch longer than every bucket is padded to its own length (a shape of its own;
    the recipes' last bucket is ``--max_seq_length``, where they truncate, so it does not happen there)."""

    def __init__(self, collator: Any, buckets: Sequence[int]):
        if not dataclasses.is_dataclass(collator) or not {"padding", "max_length"} <= {
                f.name for f in dataclasses.fields(collator)}:
            raise TypeError(f"BucketPadding wraps a padding collator with `padding` and `max_length` fields "
                            f"(DataCollatorWithPadding, DataCollatorForTokenClassification), not {type(collator).__name__}.")
        self.collator = collator
        self.buckets = tuple(sorted(buckets))
        self._per_length: Dict[int, Callable] = {}

    def bucket_for(self, longest: int) -> Optional[int]:
        return next((length for length in self.buckets if length >= longest), None)

    def __call__(self, features: List[Dict[str, Any]]):
        longest = max(len(feature["input_ids"]) for feature in features)
        bucket = self.bucket_for(longest)
        if bucket is None:
            return self.collator(features)
        if bucket not in self._per_length:
            changes = {"padding": "max_length", "max_length": bucket}
            if "pad_to_multiple_of" in {f.name for f in dataclasses.fields(self.collator)}:
                changes["pad_to_multiple_of"] = None
            self._per_length[bucket] = dataclasses.replace(self.collator, **changes)
        return self._per_length[bucket](features)

    def __repr__(self) -> str:
        return f"BucketPadding({type(self.collator).__name__}, buckets={list(self.buckets)})"


def settle_problem_type(model: Any, labels: Any) -> Optional[str]:
    """Set a sequence classifier's ``config.problem_type`` from the labels before its first compiled forward, as
    that forward would (one output: regression; integer labels: single-label; else multi-label). Left to the
    forward, the attribute changes after step 1 and every compiled step compiles again. Returns what was set."""
    config = getattr(model, "config", None)
    if (config is None or getattr(config, "problem_type", "unset") is not None or labels is None
            or not type(model).__name__.endswith("ForSequenceClassification")):
        return None
    import torch

    if config.num_labels == 1:
        config.problem_type = "regression"
    elif labels.dtype in (torch.long, torch.int):
        config.problem_type = "single_label_classification"
    else:
        config.problem_type = "multi_label_classification"
    return config.problem_type
