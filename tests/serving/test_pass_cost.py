"""PassCost: the batcher's per-pass overhead, fitted from the passes a worker ran."""

from __future__ import annotations

import random

import pytest

from bitfit_hf.serving.pass_cost import PRIOR_OVERHEAD_TOKENS, PassCost


def feed(cost: PassCost, overhead_ms: float, per_token_ms: float, sizes, noise: float = 0.0, seed: int = 0) -> None:
    rng = random.Random(seed)
    for tokens in sizes:
        cost.observe(tokens, (overhead_ms + per_token_ms * tokens) * (1 + rng.uniform(-noise, noise)) / 1000)


def test_the_prior_holds_until_enough_passes_were_seen():
    cost = PassCost(min_passes=20)
    feed(cost, 20.0, 0.1, [50, 100, 200] * 6)  # 18 passes
    assert cost.overhead_tokens == PRIOR_OVERHEAD_TOKENS
    feed(cost, 20.0, 0.1, [50, 100])
    assert cost.overhead_tokens == pytest.approx(200, rel=1e-6)  # 20 ms / 0.1 ms a token


def test_the_fit_finds_the_overhead_through_timing_noise():
    cost, rng = PassCost(), random.Random(1)
    feed(cost, 11.75, 0.155, [rng.choice([20, 60, 120, 250, 400]) for _ in range(300)], noise=0.1)
    assert cost.overhead_tokens == pytest.approx(11.75 / 0.155, rel=0.25)


def test_passes_of_one_size_or_a_slope_that_is_not_positive_keep_the_last_estimate():
    cost = PassCost(min_passes=5)
    feed(cost, 5.0, 0.25, [100] * 50)  # no spread of sizes: nothing to fit
    assert cost.overhead_tokens == PRIOR_OVERHEAD_TOKENS
    flat = PassCost(min_passes=5)
    for tokens in [10, 100, 1000] * 5:
        flat.observe(tokens, 0.05 - tokens * 1e-5)  # bigger passes faster: not a cost model
    assert flat.overhead_tokens == PRIOR_OVERHEAD_TOKENS


def test_the_estimate_stays_within_its_bounds_and_bad_timings_are_ignored():
    cost = PassCost(min_passes=5, max_tokens=500)
    feed(cost, 1000.0, 0.01, [10, 20, 40] * 5)  # 100,000 tokens' worth
    assert cost.overhead_tokens == 500
    negative = PassCost(min_passes=5)
    for tokens in [10, 20, 40] * 5:
        negative.observe(tokens, tokens * 1e-3 - 0.005)  # a negative intercept
    assert negative.overhead_tokens == 0.0
    before = negative.passes
    negative.observe(0, 0.01)
    negative.observe(10, 0.0)
    negative.observe(10, float("nan"))
    assert negative.passes == before


def test_old_passes_are_forgotten_when_the_machine_changes():
    cost = PassCost(decay=0.95)
    sizes = [30, 80, 200, 400] * 40
    feed(cost, 9.3, 0.255, sizes)  # one torch thread
    assert cost.overhead_tokens == pytest.approx(36.5, rel=0.02)
    feed(cost, 11.75, 0.155, sizes)  # two: the per-token work halves, the per-pass work does not
    assert cost.overhead_tokens == pytest.approx(75.8, rel=0.02)


def test_decay_outside_its_range_is_refused():
    with pytest.raises(ValueError, match="decay"):
        PassCost(decay=0.0)
