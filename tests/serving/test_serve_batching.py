"""Which adapters share a mixed-task batch: a method that says its tasks cannot (``Method.not_batchable``) is served
by switching, even when every tensor it trains is a bias."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from serve_support import adapters  # noqa: F401 - fixture
from tiny import make_adapter

from bitfit_hf import BitFitAdapter, BitFitConfig
from bitfit_hf.serving.models import Backbone, Registry, mixable
from bitfit_hf.tuners import Method, register_method, unregister_method
from bitfit_hf.tuners.bias.model import apply_bitfit

REASON = "its biases are per-example state no shared batch can hold"


@dataclass
class UnbatchableConfig(BitFitConfig):
    method: ClassVar[str] = "toy_unbatchable"


class Unbatchable(Method):
    """BitFit's biases, under a method that refuses mixed batches."""

    name = "toy_unbatchable"
    config_class = UnbatchableConfig
    not_batchable = REASON

    def apply(self, model, config):
        return apply_bitfit(model, config)


@pytest.fixture
def unbatchable(adapters, tmp_path):  # noqa: F811
    register_method(Unbatchable)
    try:
        yield make_adapter(adapters["base"], str(tmp_path / "unbatchable"), 2, seed=3,
                           method_config=UnbatchableConfig("all"))
    finally:
        unregister_method("toy_unbatchable")


def test_a_method_that_cannot_share_a_batch_is_switched_whatever_its_tensor_names(adapters, unbatchable):  # noqa: F811
    plain = BitFitAdapter.from_pretrained(adapters["c0"])
    odd = BitFitAdapter.from_pretrained(unbatchable)
    assert all(name.endswith(".bias") or name.startswith("classifier.") for name in odd.config.trained_parameters)
    assert mixable(plain.config) is None
    assert mixable(odd.config) == f"toy_unbatchable: {REASON}"

    registry = Registry(Backbone(device="cpu", dtype="float32"))
    assert registry.add_many([("c0", adapters["c0"], None, plain), ("odd", unbatchable, None, odd)]) == []
    assert registry.entries["c0"].mode == "mixed" and registry.entries["c0"].switch_reason is None
    assert registry.entries["odd"].mode == "switch" and registry.entries["odd"].switch_reason == f"toy_unbatchable: {REASON}"
