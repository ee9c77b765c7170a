"""The method registry: a name is registered once (a second registration is refused, naming the method that has it),
and a method's one-line description states bias terms only where its config has them."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, List

import pytest

from bitfit_hf import BitFitConfig
from bitfit_hf.tuners import METHODS, Method, describe_method, register_method, unregister_method
from bitfit_hf.tuners.bias.model import apply_bitfit


class _Impostor(Method):
    name = "bitfit"
    config_class = BitFitConfig

    def apply(self, model, config):
        return apply_bitfit(model, config)


def test_a_second_method_of_a_registered_name_is_refused_naming_the_first():
    registered = METHODS["bitfit"]
    with pytest.raises(ValueError) as caught:
        register_method(_Impostor)
    message = str(caught.value)
    assert "'bitfit' is already registered" in message
    assert "bitfit_hf.tuners.bitfit.method.BitFit" in message  # the method that holds the name
    assert "_Impostor" in message and "unregister_method('bitfit')" in message
    assert METHODS["bitfit"] is registered  # nothing replaced
    with pytest.raises(ValueError, match="already registered"):
        register_method(registered)  # the very same method, registered twice


def test_unregistering_first_replaces_a_method_on_purpose():
    class Toy(Method):
        name = "toy_registry"
        config_class = BitFitConfig

    class Other(Toy):
        pass

    first = register_method(Toy)
    try:
        with pytest.raises(ValueError, match="'toy_registry' is already registered"):
            register_method(Other)
        unregister_method("toy_registry")
        assert isinstance(register_method(Other), Other) and METHODS["toy_registry"] is not first
    finally:
        unregister_method("toy_registry")
    assert "toy_registry" not in METHODS


@dataclasses.dataclass
class _NoBiasConfig:
    """A config with no bias selection, as AdapterBias's: empty selection fields, settings of its own."""

    method: ClassVar[str] = "toy_nobias"
    bias_terms: ClassVar[List[str]] = []
    scale: float = 2.0

    def to_dict(self):
        return dataclasses.asdict(self)


def test_the_default_description_states_bias_terms_only_where_the_config_has_them():
    assert Method().describe(BitFitConfig("b_q b_v")) == "bitfit (b_q b_v)"
    assert Method().describe(_NoBiasConfig()) == "toy_nobias (scale=2.0)"  # no empty "()" of bias terms
    assert describe_method(BitFitConfig("one-d")) == "bitfit (one-d)"


def test_a_method_defining_retired_bank_hooks_is_told_to_define_route():
    class OldStyle(Method):
        name = "toy_old_hooks"
        config_class = BitFitConfig

        def bank_attach(self, model, modules, method_config):
            return {}

    try:
        with pytest.warns(FutureWarning, match=r"defines bank_attach, which bitfit-hf no longer calls.*route\(\)"):
            register_method(OldStyle)
    finally:
        unregister_method("toy_old_hooks")
