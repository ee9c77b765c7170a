"""``apply_bitfit`` (:mod:`bitfit_hf.tuners.bias.model`, shared with the methods that call it first) and the
state helpers every method shares (:mod:`bitfit_hf.tuners.state`); this module keeps the method's import path."""

from bitfit_hf.tuners.bias.model import BitFitState, apply_bitfit
from bitfit_hf.tuners.state import (
    adapter_parameter_names,
    get_bitfit_state,
    get_tuner_state,
    set_tuner_state,
    trainable_state_dict,
    unwrap,
)

__all__ = ["BitFitState", "adapter_parameter_names", "apply_bitfit", "get_bitfit_state", "get_tuner_state",
           "set_tuner_state", "trainable_state_dict", "unwrap"]
