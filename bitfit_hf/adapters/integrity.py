"""A content hash of an adapter's tensors, written into its config and checked on every load.

safetensors has no checksum: a byte flipped inside the tensor data loads as a wrong number (often a NaN)
without a word. The hash covers, per tensor in name order, its name, dtype, shape and raw bytes, so it
does not depend on how the file lays the tensors out, and a re-save of the same tensors gives the same
hash. Adapters written before the hash existed (format 1) load without the check.
"""

from __future__ import annotations

import hashlib
from typing import Dict

import torch

from bitfit_hf.adapters.config import AdapterConfig, AdapterError

DIGEST_PREFIX = "sha256:"


def tensors_digest(tensors: Dict[str, torch.Tensor]) -> str:
    """``sha256:<hex>`` of the tensors' names, dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}\0{str(tensor.dtype).replace('torch.', '')}\0{tuple(tensor.shape)}\0".encode("utf-8"))
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return DIGEST_PREFIX + digest.hexdigest()


def verify_tensors(config: AdapterConfig, tensors: Dict[str, torch.Tensor], source: str) -> None:
    """Raise :class:`AdapterError` when ``tensors`` are not the ones ``config`` was saved with.

    Format 2 adapters must carry the hash; a format 1 adapter without one is accepted unchecked.
    """
    expected = config.tensors_sha256
    if expected is None:
        if config.format_version >= 2:
            raise AdapterError(
                f"{source} has adapter format {config.format_version} but no tensors_sha256: the adapter is damaged. "
                "Download it again, or re-save it from the trained model."
            )
        return
    found = tensors_digest(tensors)
    if found != expected:
        raise AdapterError(
            f"{source} is corrupt: its tensors do not match the content hash recorded when it was saved "
            f"({expected[:23]}..., found {found[:23]}...). Download the adapter again, or re-save it from the "
            "trained model."
        )
