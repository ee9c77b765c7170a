"""The constant predictor's score beside the benchmarks' tables: a figure means little without it."""

from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence


def majority_share(labels: Sequence) -> float:
    """The constant predictor's accuracy: the share of the most frequent label."""
    return Counter(labels).most_common(1)[0][1] / len(labels)


def dev_split_majority(dev_size: int) -> Optional[float]:
    """The majority share of the dev split ``--dev_split_from_train dev_size`` carves from the offline movie-review
    training data (the recipe's own carving); None when that data is not at hand (the table is written without it)."""
    try:
        from bitfit_hf.recipe_kit.data import carve_dev_split, load_offline_dataset

        labels = list(carve_dev_split(load_offline_dataset("movie_reviews"), dev_size)["validation"]["label"])
    except Exception:  # noqa: BLE001 - context for a table, never a reason to lose it
        return None
    return majority_share(labels)
