"""Tensors trained only in some entries, stored as indices + values instead of a dense copy.

A random-subset adapter trains a few thousand entries of matrices holding millions; saving the
matrices would ship the frozen base weights. Such a parameter ``W`` is stored as two tensors,
``W.sparse_indices`` (sorted flat int64 positions, row-major) and ``W.sparse_values`` (the trained
values at those positions), and written back into a model's own ``W`` with a scatter.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

import torch

INDICES_SUFFIX = ".sparse_indices"
VALUES_SUFFIX = ".sparse_values"


def pack(tensors: Dict[str, torch.Tensor], sparse_indices: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``tensors`` with each parameter named in ``sparse_indices`` replaced by its indices and values."""
    out: Dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name not in sparse_indices:
            out[name] = tensor
            continue
        indices = sparse_indices[name].detach().to("cpu", torch.int64).contiguous()
        out[name + INDICES_SUFFIX] = indices
        out[name + VALUES_SUFFIX] = tensor.detach().reshape(-1)[indices].contiguous()
    return out


def tensor_names(parameter: str) -> Tuple[str, str]:
    """The two stored tensor names of a sparse parameter."""
    return parameter + INDICES_SUFFIX, parameter + VALUES_SUFFIX


def split(tensors: Dict[str, torch.Tensor], sparse_parameters: Iterable[str]):
    """``(dense tensors, {parameter: (indices, values)})`` of an adapter's stored tensors."""
    sparse = {}
    stored = set()
    for name in sparse_parameters:
        indices_name, values_name = tensor_names(name)
        sparse[name] = (tensors[indices_name], tensors[values_name])
        stored.update((indices_name, values_name))
    dense = {k: v for k, v in tensors.items() if k not in stored}
    return dense, sparse


def check(name: str, indices: torch.Tensor, values: torch.Tensor, numel: int) -> List[str]:
    """Problems with one stored sparse parameter against a model tensor of ``numel`` entries."""
    problems = []
    if indices.dtype != torch.int64 or indices.dim() != 1:
        problems.append(f"{name}{INDICES_SUFFIX} must be a 1-D int64 tensor")
    elif values.shape != indices.shape:
        problems.append(f"{name} stores {indices.numel()} indices but {values.numel()} values")
    elif indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= numel):
        problems.append(f"{name}{INDICES_SUFFIX} points outside the model's tensor ({numel} entries)")
    return problems


def scatter_(param: torch.Tensor, indices: torch.Tensor, values: torch.Tensor) -> None:
    """Write ``values`` at the flat ``indices`` of ``param`` in place (no grad)."""
    with torch.no_grad():
        flat = param.data.view(-1)
        flat[indices.to(flat.device)] = values.to(device=flat.device, dtype=flat.dtype)


def densify(base: torch.Tensor, indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A copy of ``base`` with the stored entries written in."""
    out = base.detach().clone()
    scatter_(out, indices, values)
    return out
