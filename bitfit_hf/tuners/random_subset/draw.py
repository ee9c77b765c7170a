"""Which weight entries the random baselines train: the candidate matrices and the seeded draws.

The candidates are the base model's weight matrices (every parameter with two or more dimensions)
outside the task head, the input embeddings and the output embeddings: the encoder's (or decoder
stack's) projections, plus the pooler where there is one. Entries are addressed by flat index into
each tensor (row-major), so a draw is a ``{parameter name: sorted int64 indices}`` mapping that an
adapter can store and a loader can scatter back.

Both draws use a CPU ``torch.Generator`` seeded with ``random_seed`` and nothing else, so the same
seed on the same model gives the same entries on every machine, process and rank.
"""

from __future__ import annotations

import bisect
from typing import Dict, List, Tuple

import torch
from torch import nn

from bitfit_hf.utils.names import is_under
from bitfit_hf.utils.zero import full_shape

Draw = Dict[str, torch.Tensor]


def candidate_weights(model: nn.Module, head_modules: List[str]) -> List[Tuple[str, Tuple[int, ...]]]:
    """``(name, shape)`` of every weight matrix a random baseline may train, in model order."""
    embeddings = set()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            embeddings.add(id(module.weight))
    if hasattr(model, "get_output_embeddings"):
        output = model.get_output_embeddings()
        if output is not None and getattr(output, "weight", None) is not None:
            embeddings.add(id(output.weight))
    out = []
    for name, param in model.named_parameters():
        shape = tuple(full_shape(param))
        if len(shape) < 2 or id(param) in embeddings:
            continue
        if is_under(name, head_modules):
            continue
        out.append((name, shape))
    return out


def _numel(shape) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count


def _check_count(count: int, total: int, what: str) -> None:
    if count <= 0:
        raise ValueError(f"The reference selection has no trainable scalar outside the head: nothing to {what}.")
    if count > total:
        raise ValueError(f"Cannot {what} {count:,} entries from weight matrices holding {total:,}.")


def draw_uniform(candidates: List[Tuple[str, Tuple[int, ...]]], count: int, seed: int) -> Draw:
    """``count`` distinct entries, each of all candidate entries equally likely (no replacement)."""
    sizes = [_numel(shape) for _, shape in candidates]
    total = sum(sizes)
    _check_count(count, total, "draw")
    generator = torch.Generator().manual_seed(seed)
    if count * 8 >= total or total <= 1 << 24:
        positions = torch.randperm(total, generator=generator)[:count]
    else:  # a permutation of billions of entries is too big: draw with rejection of repeats
        seen, chosen = set(), []
        while len(chosen) < count:
            for value in torch.randint(total, (2 * (count - len(chosen)) + 16,), generator=generator).tolist():
                if value not in seen:
                    seen.add(value)
                    chosen.append(value)
                    if len(chosen) == count:
                        break
        positions = torch.tensor(chosen, dtype=torch.int64)
    starts = torch.tensor([0] + sizes[:-1], dtype=torch.int64).cumsum(0)
    owner = torch.searchsorted(starts, positions, right=True) - 1
    draw: Draw = {}
    for index, (name, _) in enumerate(candidates):
        local = positions[owner == index] - starts[index]
        if local.numel():
            draw[name] = torch.sort(local).values
    return draw


def draw_rows_cols(candidates: List[Tuple[str, Tuple[int, ...]]], count: int, seed: int) -> Draw:
    """Whole rows or columns until ``count`` distinct entries are chosen; the last line is cut short.

    Every line (a row or a column of a matrix; a tensor with more than two dimensions is seen as
    ``[shape[0], rest]``) is equally likely. A row and a column cross in one entry, which is counted
    once; the last line drawn contributes only as many of its new entries as the count still needs.
    """
    shapes = [(shape[0], _numel(shape) // shape[0]) for _, shape in candidates]
    total = sum(rows * cols for rows, cols in shapes)
    _check_count(count, total, "draw")
    lines = [rows + cols for rows, cols in shapes]
    starts = torch.tensor([0] + lines[:-1], dtype=torch.int64).cumsum(0).tolist()
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(sum(lines), generator=generator).tolist()
    masks: Dict[int, torch.Tensor] = {}
    needed = count
    for line in order:
        index = bisect.bisect_right(starts, line) - 1
        rows, cols = shapes[index]
        offset = line - starts[index]
        mask = masks.setdefault(index, torch.zeros(rows, cols, dtype=torch.bool))
        view = mask[offset] if offset < rows else mask[:, offset - rows]
        new = (~view).nonzero().flatten()[:needed]
        view[new] = True
        needed -= new.numel()
        if needed == 0:
            break
    return {candidates[i][0]: mask.flatten().nonzero().flatten() for i, mask in sorted(masks.items()) if mask.any()}
