"""--dev_split_from_train: the evaluation set is carved from the end of the training data."""

from __future__ import annotations

import datasets
import pytest

from bitfit_hf.recipe_kit.data import carve_dev_split
from bitfit_hf.recipe_kit.errors import RecipeError


def raw(n_train=10):
    return datasets.DatasetDict(train=datasets.Dataset.from_dict({"x": list(range(n_train))}),
                                validation=datasets.Dataset.from_dict({"x": [100, 101]}))


def test_the_last_training_examples_become_the_evaluation_set_and_the_validation_set_is_unused():
    carved = carve_dev_split(raw(), 3)
    assert carved["validation"]["x"] == [7, 8, 9]
    assert carved["train"]["x"] == list(range(7)), "the first examples stay first (--max_train_samples unchanged)"
    assert 100 not in carved["validation"]["x"] and 100 not in carved["train"]["x"]


@pytest.mark.parametrize("size", [10, 11])
def test_carving_everything_is_refused(size):
    with pytest.raises(RecipeError, match="training split has 10"):
        carve_dev_split(raw(), size)


def test_without_training_data_it_says_so():
    with pytest.raises(RecipeError, match="give training data"):
        carve_dev_split(datasets.DatasetDict(validation=datasets.Dataset.from_dict({"x": [1]})), 1)
