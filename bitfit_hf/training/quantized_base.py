"""Let ``transformers.Trainer`` train the biases of a quantized base (QBitFit).

``Trainer.__init__`` refuses any model that a quantizer loaded unless trainable adapters are attached,
and the only adapters it recognises are PEFT's (the ``_hf_peft_config_loaded`` flag that transformers'
PEFT integration sets on the model). That guard exists because gradients cannot flow into quantized
weights; BitFit never asks them to: its trained biases are float32 parameters next to the frozen
weights (:mod:`bitfit_hf.tuners.bias.quantized`), i.e. they are the attached adapter. So, for the length of
``Trainer.__init__`` only, the model carries that flag; it is restored afterwards so nothing else
(saving, ``model.save_pretrained``) takes the model for a PEFT one.
"""

from __future__ import annotations

import contextlib

from torch import nn

from bitfit_hf.tuners.state import unwrap
from bitfit_hf.utils.base_loading import quantization_method

_PEFT_FLAG = "_hf_peft_config_loaded"
_ABSENT = object()


@contextlib.contextmanager
def biases_count_as_adapter(model: nn.Module, trainable_numel: int):
    """Inside this context, transformers' quantized-model guard sees ``model``'s trained biases as the
    attached adapter (only when a quantizer loaded it and something is trained)."""
    inner = unwrap(model)
    if quantization_method(inner) is None or trainable_numel == 0 or getattr(inner, _PEFT_FLAG, False):
        yield
        return
    previous = inner.__dict__.get(_PEFT_FLAG, _ABSENT)
    setattr(inner, _PEFT_FLAG, True)
    try:
        yield
    finally:
        if previous is _ABSENT:
            inner.__dict__.pop(_PEFT_FLAG, None)
        else:
            setattr(inner, _PEFT_FLAG, previous)
