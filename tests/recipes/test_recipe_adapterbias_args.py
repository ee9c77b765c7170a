"""`--method adapterbias [--share_alpha]`: the AdapterBias config, its swept 1e-2 learning rate unless
given, separate default output folders, and BitFit-only flags refused before anything is loaded."""

from __future__ import annotations

import pytest
from test_recipe_args import parse

from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.tuners.adapterbias import AdapterBiasConfig


def test_adapterbias_defaults_to_the_swept_learning_rate():
    parsed = parse("--method", "adapterbias")
    assert parsed.training.learning_rate == 1e-2
    assert parsed.training.output_dir.endswith("-adapterbias")
    config = parsed.bitfit.method_config()
    assert isinstance(config, AdapterBiasConfig) and not config.share_alpha
    assert parse("--method", "adapterbias", "--learning_rate", "3e-4").training.learning_rate == 3e-4


def test_share_alpha_gets_its_own_output_folder_and_config():
    parsed = parse("--method", "adapterbias", "--share_alpha", "--head_learning_rate", "1e-3")
    assert parsed.training.output_dir.endswith("-adapterbias-shared")
    config = parsed.bitfit.method_config()
    assert config.share_alpha and config.head_learning_rate == 1e-3


@pytest.mark.parametrize("argv, message", [
    (["--share_alpha"], "--share_alpha applies to --method adapterbias only"),
    (["--method", "adapterbias", "--bias_terms", "b_q"], "--bias_terms select or tune BitFit's biases"),
    (["--method", "adapterbias", "--add_missing_biases"], "--add_missing_biases select or tune"),
])
def test_bitfit_only_flags_are_refused(argv, message):
    with pytest.raises(RecipeError, match=message):
        parse(*argv).bitfit.method_config()
