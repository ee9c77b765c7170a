"""Claim 1 from configurations: the library's count against the BERT parameter formula."""

from __future__ import annotations

import pytest

from bitfit_hf.study.param_counts import PUBLISHED_CONFIGS, count_bias_fraction


def bert_formula(h, layers, inter, vocab, positions, types):
    """BERT's parameter count written out by hand (embeddings, layers, pooler)."""
    layer_biases = 4 * h + h + inter + h + h  # q k v m1, LN1, m2, m3, LN2
    biases = layers * layer_biases + h + h  # + embeddings LayerNorm + pooler
    embeddings = (vocab + positions + types) * h + 2 * h
    per_layer = 4 * (h * h + h) + 2 * h + (h * inter + inter) + (inter * h + h) + 2 * h
    total = embeddings + layers * per_layer + h * h + h
    return biases, total


@pytest.mark.parametrize("name, sizes", [("bert-base", (768, 12, 3072)),
                                         pytest.param("bert-large", (1024, 24, 4096), marks=pytest.mark.slow)])
def test_bias_counts_match_the_formula(name, sizes):
    counts = count_bias_fraction(PUBLISHED_CONFIGS[name]())
    biases, total = bert_formula(*sizes, vocab=30522, positions=512, types=2)
    assert counts["all_bias_params"] == biases and counts["total_params"] == total
    assert counts["all_percent"] == pytest.approx(100 * biases / total)
    h, layers, inter = sizes
    assert counts["paper_subset_bias_params"] == layers * (h + inter)  # b_q + b_m2
