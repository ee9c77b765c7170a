"""Features into a padded batch, and each row's own outputs back out of the model's: shared by the server's
worker and the in-process predictor, so padding never changes an answer in one and not the other."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch

from bitfit_hf.inference.inputs import Feature


def collate(features: Sequence[Feature], pad_id: int, left: bool, device) -> Dict[str, torch.Tensor]:
    """Pad features to the longest one (on the left for left-padding tokenizers)."""
    width = max(f.length for f in features)
    batch: Dict[str, torch.Tensor] = {}
    for key in features[0].features:
        fill = pad_id if key == "input_ids" else 0
        rows = []
        for f in features:
            values = f.features[key]
            padding = [fill] * (width - len(values))
            rows.append(padding + values if left else values + padding)
        batch[key] = torch.tensor(rows, dtype=torch.long, device=device)
    return batch


def per_row(logits: Optional[torch.Tensor], raw: Any, lengths: List[int], left: bool,
            widths: Optional[List[Optional[int]]] = None) -> List[Any]:
    """Each row's outputs on the CPU, its padding cut: a logits row (per token for tagging, cut to ``widths[r]``
    labels where a mixed batch padded the label axis), or, when ``logits`` is ``None``, QA's
    ``(start_logits, end_logits)`` read from ``raw`` (the model's output)."""
    if logits is None:
        start_cpu, end_cpu = raw.start_logits.float().cpu(), raw.end_logits.float().cpu()
        rows = []
        for r, n in enumerate(lengths):
            cut = slice(start_cpu.shape[1] - n, None) if left else slice(0, n)
            rows.append((start_cpu[r, cut], end_cpu[r, cut]))
        return rows
    cpu = logits.float().cpu()
    rows = []
    for r, n in enumerate(lengths):
        row = cpu[r]
        if row.dim() == 2:  # per token
            row = row[row.shape[0] - n:] if left else row[:n]
        width = widths[r] if widths else None
        rows.append(row[..., :width] if width else row)
    return rows
