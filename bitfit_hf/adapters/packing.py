"""Packed encoder passes: a batch's inputs laid end to end in rows, so the encoder computes no padding.

A padded batch of inputs of different lengths spends the encoder's matrix products on pad tokens too. Here
the embeddings still run on the padded batch (so every model computes its own positions and token types),
then the encoder gets the real tokens packed into rows of about :data:`ROW_TOKENS` tokens, each input in a
block of its own that attends only to itself, and its output is put back in the padded layout before the
pooler and the heads. An input's tokens keep their order and neighbours, so a layer that sees only the
tokens of its own block computes what it computes in the padded batch; a layer that reads absolute positions
inside the encoder (rotary embeddings from ``position_ids``) would not, which is why a model is packed only
after :func:`packing_agrees` has compared a packed pass with a padded one on it.

Modules inside the encoder see the packed rows; :attr:`Packing.example_of` says which example each packed
position holds, so the per-example routing (:mod:`bitfit_hf.adapters.routing`) can give every token its own
example's adapter.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, List, Optional

import torch
from torch import nn

__all__ = ["ROW_TOKENS", "Packing", "encoder_of", "pack_into_rows", "packed", "packing_agrees"]

#: The tokens a row of packed inputs aims at: a row attends over all its positions (masked between inputs),
#: so much wider rows spend on attention what they save on padding.
ROW_TOKENS = 64

#: Attention implementations whose masks are a plain ``[batch, 1, query, key]`` tensor, which packing replaces.
_MASKED = ("eager", "sdpa")


def encoder_of(model: nn.Module) -> Optional[nn.Module]:
    """The encoder stack of an encoder-only transformers model (``base_model.encoder``), or None where there is
    none or its attention is not one whose mask packing can give (flash attention takes no mask)."""
    base = getattr(model, "base_model", model)
    encoder = getattr(base, "encoder", None)
    config = getattr(model, "config", None)
    if not isinstance(encoder, nn.Module) or config is None or getattr(config, "is_decoder", False):
        return None
    if getattr(config, "is_encoder_decoder", False):
        return None
    if getattr(config, "_attn_implementation", "eager") not in _MASKED:
        return None
    return encoder


def pack_into_rows(lengths: List[int], width: int) -> List[List[int]]:
    """The inputs (by index) in ``ceil(total / width)`` rows of about equal length: longest first, each into the
    row that holds the fewest tokens so far (rows are padded to the longest of them)."""
    count = max(1, min(len(lengths), -(-sum(lengths) // width)))
    rows: List[List[int]] = [[] for _ in range(count)]
    load = [0] * count
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = min(range(count), key=load.__getitem__)
        rows[r].append(i)
        load[r] += lengths[i]
    return [row for row in rows if row]


@dataclass
class Packing:
    """Where each token of a right-padded ``[batch, width]`` batch goes in ``[rows, row_width]`` packed rows.

    ``take``: for each packed position, its flat index in the padded batch (a pad takes position 0: any real
    value, never read). ``put``: for each padded position, its flat index in the packed rows, or the index one
    past them (a zero row) for a pad. ``example_of``: the example each packed position holds, ``batch`` for a
    pad. ``segment``: each packed position's input within its row, ``-1`` for the row's pads."""

    batch: int
    width: int
    rows: int
    row_width: int
    take: torch.Tensor
    put: torch.Tensor
    example_of: torch.Tensor
    segment: torch.Tensor

    @classmethod
    def of(cls, attention_mask: torch.Tensor, row_tokens: int = ROW_TOKENS) -> Optional["Packing"]:
        """The packing of a right-padded batch, or None where it would compute as many tokens as the padded one
        (one input, no padding, or inputs too long to share a row)."""
        if attention_mask.dim() != 2:
            return None
        batch, width = attention_mask.shape
        lengths = attention_mask.sum(dim=1).tolist()
        if batch < 2 or min(lengths) < 1:
            return None
        expected = torch.arange(width, device=attention_mask.device)[None, :] < attention_mask.sum(1, keepdim=True)
        if not torch.equal(attention_mask.bool(), expected):
            return None  # padded on the left, or holes: not laid out as this packing reads it
        rows = pack_into_rows(lengths, row_tokens)
        row_width = max(sum(lengths[i] for i in row) for row in rows)
        if len(rows) * row_width >= batch * width:
            return None
        device = attention_mask.device
        starts, segments = [0] * batch, [0] * batch  # each input's first packed position, its block in its row
        for r, row in enumerate(rows):
            at = r * row_width
            for s, i in enumerate(row):
                starts[i], segments[i] = at, s
                at += lengths[i]
        size = len(rows) * row_width
        counts = torch.tensor(lengths, device=device)
        example = torch.repeat_interleave(torch.arange(batch, device=device), counts)
        within = torch.arange(sum(lengths), device=device) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        dst = torch.repeat_interleave(torch.tensor(starts, device=device), counts) + within
        src = example * width + within
        take = torch.zeros(size, dtype=torch.long, device=device).index_copy_(0, dst, src)
        put = torch.full((batch * width,), size, dtype=torch.long, device=device).index_copy_(0, src, dst)
        example_of = torch.full((size,), batch, dtype=torch.long, device=device).index_copy_(0, dst, example)
        segment = torch.full((size,), -1, dtype=torch.long, device=device).index_copy_(
            0, dst, torch.repeat_interleave(torch.tensor(segments, device=device), counts))
        return cls(batch, width, len(rows), row_width, take, put, example_of, segment.view(len(rows), row_width))

    def pack(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[batch, width, ...]`` to ``[rows, row_width, ...]``."""
        flat = hidden.reshape(self.batch * self.width, *hidden.shape[2:])
        return flat.index_select(0, self.take).view(self.rows, self.row_width, *hidden.shape[2:])

    def unpack(self, packed_hidden: torch.Tensor) -> torch.Tensor:
        """``[rows, row_width, ...]`` back to ``[batch, width, ...]``, pad positions zero."""
        flat = packed_hidden.reshape(self.rows * self.row_width, *packed_hidden.shape[2:])
        flat = torch.cat([flat, flat.new_zeros(1, *flat.shape[1:])])
        return flat.index_select(0, self.put).view(self.batch, self.width, *packed_hidden.shape[2:])

    def mask(self, like: Optional[torch.Tensor], dtype: torch.dtype, implementation: str) -> torch.Tensor:
        """``[rows, 1, row_width, row_width]``: a position attends to its own input's positions (a row's pads to
        each other, so no query is left with nothing), in the form the model's own mask has (``like``): boolean,
        or additive with the dtype's lowest value."""
        same = self.segment[:, :, None] == self.segment[:, None, :]
        boolean = like.dtype == torch.bool if like is not None else implementation == "sdpa"
        if boolean:
            return same.unsqueeze(1)
        additive = torch.zeros(same.shape, dtype=dtype, device=same.device).masked_fill_(~same, torch.finfo(dtype).min)
        return additive.unsqueeze(1)


@contextlib.contextmanager
def packed(model: nn.Module, packing: Packing) -> Iterator[None]:
    """While open, ``model``'s encoder runs on ``packing``'s rows and hands its output back padded."""
    encoder = encoder_of(model)
    if encoder is None:
        raise ValueError(f"{type(model).__name__} has no encoder whose attention mask packing can replace.")
    implementation = getattr(model.config, "_attn_implementation", "eager")

    def before(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        rows = packing.pack(hidden)
        new_mask = packing.mask(mask if isinstance(mask, torch.Tensor) else None, hidden.dtype, implementation)
        args = (rows, *args[1:]) if args else args
        if not args:
            kwargs["hidden_states"] = rows
        if len(args) > 1:
            args = (args[0], new_mask, *args[2:])
        else:
            kwargs["attention_mask"] = new_mask
        return args, kwargs

    def after(module, args, kwargs, output):
        if hasattr(output, "keys"):
            output["last_hidden_state"] = packing.unpack(output["last_hidden_state"])
            return output
        return (packing.unpack(output[0]), *output[1:])

    handles = [encoder.register_forward_pre_hook(before, with_kwargs=True),
               encoder.register_forward_hook(after, with_kwargs=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.inference_mode()
def packing_agrees(model: nn.Module, pad_id: int = 0, atol: Optional[float] = None) -> bool:
    """Whether a packed pass of ``model`` gives what a padded one gives, on a probe batch of three inputs of
    different lengths (two of them share a row, one starting mid-row): the check that a model's encoder reads
    nothing but its own block's tokens. ``atol`` (relative to the largest value): 1e-4 in float32, 5e-2 in a
    16-bit dtype, where the two passes' sums round differently."""
    encoder = encoder_of(model)
    if encoder is None:
        return False
    device = next(model.parameters()).device
    vocab = int(getattr(model.config, "vocab_size", 100))
    generator = torch.Generator().manual_seed(0)
    lengths = [9, 5, 4]
    ids = torch.full((3, 9), pad_id, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(min(5, vocab - 1), vocab, (n,), generator=generator)
    mask = (torch.arange(9)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids, mask = ids.to(device), mask.to(device)
    packing = Packing.of(mask, row_tokens=9)
    if packing is None:
        return False
    base = getattr(model, "base_model", model)
    padded = base(input_ids=ids, attention_mask=mask).last_hidden_state
    with packed(model, packing):
        packed_out = base(input_ids=ids, attention_mask=mask).last_hidden_state
    if atol is None:
        atol = 1e-4 if padded.dtype == torch.float32 else 5e-2
    real = mask.bool()
    scale = max(1.0, float(padded[real].abs().max()))
    return bool(torch.isfinite(packed_out[real]).all()) and float((padded[real] - packed_out[real]).abs().max()) <= atol * scale
