"""Adapters that stand in for trained ones (every trained tensor moved by seeded noise), and the AdapterBank check
that switching between such adapters and the base gives each one's logits bit for bit."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch

from bitfit_hf import AdapterBank, BitFitAdapter
from bitfit_hf.tuners import apply_method


def perturb_trainable(model, seed: int, scale: float = 0.3) -> None:
    """Move every trainable tensor of ``model`` by ``scale`` x seeded Gaussian noise: stands in for training."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(scale * torch.randn(param.shape, generator=g))


def perturbed_method_adapter(model, config, seed: int, scale: float = 0.3) -> BitFitAdapter:
    """The adapter of ``model`` prepared for ``config``'s method with its trained tensors perturbed."""
    apply_method(model, config)
    perturb_trainable(model, seed, scale)
    return BitFitAdapter.from_model(model)


def perturbed_adapter_and_logits(model, config, seed: int, inputs: Mapping, scale: float = 0.3):
    """``(adapter, logits on inputs)`` of ``model`` perturbed as in :func:`perturbed_method_adapter`: a bank's target."""
    apply_method(model, config)
    perturb_trainable(model, seed, scale)
    with torch.no_grad():
        logits = model(**inputs).logits
    return BitFitAdapter.from_model(model), logits


def assert_bank_switches_exactly(base, tasks: Mapping[str, tuple], order: Sequence[Optional[str]], inputs: Mapping) -> None:
    """``base`` banking ``tasks`` (name -> (adapter, logits)), switched along ``order`` (None: base), gives them exactly."""
    with torch.no_grad():
        base_logits = base(**inputs).logits
    bank = AdapterBank(base)
    for name, (adapter, _) in tasks.items():
        bank.add(name, adapter)
    expected = {**{name: logits for name, (_, logits) in tasks.items()}, None: base_logits}
    with torch.no_grad():
        for name in order:
            bank.activate(name) if name else bank.restore_base()
            assert torch.equal(base(**inputs).logits, expected[name]), name
