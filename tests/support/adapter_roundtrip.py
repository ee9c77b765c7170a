"""The round trip a method's trained adapter must survive: reloaded onto its stock base, and merged into a plain
checkpoint."""

from __future__ import annotations

from typing import Mapping

import torch
import transformers as T

from bitfit_hf import AutoBitFitModel, export_merged


def assert_reloads_exactly_and_merges(adapter_dir, base_dir, merged_dir, inputs: Mapping, trained: torch.Tensor, *,
                                      method_marker: str, merge_atol: float) -> None:
    """The adapter on its stock base gives ``trained`` exactly; merged, ``method_marker`` is gone and ``merge_atol`` holds."""
    loaded = AutoBitFitModel.from_pretrained(str(adapter_dir), base_model=str(base_dir)).eval()
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, trained)  # exactly

    export_merged(loaded, str(merged_dir))
    plain = T.AutoModelForSequenceClassification.from_pretrained(merged_dir).eval()
    assert not any(method_marker in n for n, _ in plain.named_parameters())
    with torch.no_grad():
        diff = (plain(**inputs).logits - trained).abs().max().item()
    assert diff <= merge_atol, diff
