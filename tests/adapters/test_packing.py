"""Packed encoder passes: the layout (``Packing``), the check that a model may be packed (``packing_agrees``), and a
packed mixed pass of every method giving what the padded pass gives."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_CONFIGS
from test_multitask_every_method import HEADS, _adapters, _base

from bitfit_hf.adapters.multitask import MultiTaskModel
from bitfit_hf.adapters.packing import Packing, encoder_of, pack_into_rows, packed, packing_agrees


def _mask(lengths, width=None):
    width = width or max(lengths)
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()


def test_rows_hold_every_input_once_and_are_about_equally_long():
    lengths = [30, 7, 12, 25, 9, 18, 3, 22]
    rows = pack_into_rows(lengths, 64)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert len(rows) == 2  # 126 tokens in rows of about 64
    loads = [sum(lengths[i] for i in row) for row in rows]
    assert max(loads) - min(loads) <= max(lengths)


def test_pack_then_unpack_gives_back_every_real_token_and_zero_pads():
    lengths = [5, 2, 4, 1]
    mask = _mask(lengths, width=6)
    packing = Packing.of(mask, row_tokens=6)
    assert packing.rows * packing.row_width < mask.numel()
    hidden = torch.randn(4, 6, 3)
    rows = packing.pack(hidden)
    assert rows.shape == (packing.rows, packing.row_width, 3)
    back = packing.unpack(rows)
    real = mask.bool()
    assert torch.equal(back[real], hidden[real])
    assert not back[~real].any()
    # every packed position knows its example, and a row's inputs see only themselves
    for example in range(4):
        assert int((packing.example_of == example).sum()) == lengths[example]
    allowed = packing.mask(None, torch.float32, "sdpa")[:, 0]
    same = packing.segment[:, :, None] == packing.segment[:, None, :]
    assert torch.equal(allowed, same)


@pytest.mark.parametrize("mask", [_mask([4]), torch.ones(3, 5, dtype=torch.long),
                                  torch.tensor([[0, 1, 1], [1, 1, 1]]), _mask([60, 60, 59], width=60)],
                         ids=["one input", "no padding", "left padded", "nothing saved"])
def test_no_packing_where_it_saves_nothing_or_the_layout_is_not_right_padded(mask):
    assert Packing.of(mask, row_tokens=64) is None


def test_an_additive_mask_where_the_model_gives_one():
    packing = Packing.of(_mask([3, 2, 1]), row_tokens=6)
    additive = packing.mask(torch.zeros(1, 1, 3, 3), torch.float32, "eager")
    assert additive.dtype == torch.float32
    assert torch.equal(additive[:, 0] == 0, packing.segment[:, :, None] == packing.segment[:, None, :])


@pytest.mark.parametrize("arch", ["bert", "roberta", "electra", "mpnet"])
def test_encoders_that_read_only_their_own_block_agree(arch):
    assert packing_agrees(_base(arch, "seq"))


def test_a_model_without_an_encoder_stack_is_not_packed():
    model = HEADS["seq"].from_config(TINY_CONFIGS["distilbert"]()).eval()
    assert encoder_of(model) is None
    assert not packing_agrees(model)


def test_an_encoder_that_reads_positions_of_its_own_is_found_out():
    """An encoder adding a position signal by place in its input (as rotary layers do from ``position_ids``)
    computes other values for an input that starts mid-row: the check must say no."""
    model = _base("bert", "seq")

    def positions(module, args, kwargs):
        hidden = args[0]
        place = torch.arange(hidden.shape[1], dtype=hidden.dtype)[None, :, None] * 0.1
        return (hidden + place, *args[1:]), kwargs

    encoder_of(model).layer[0].register_forward_pre_hook(positions, with_kwargs=True)
    assert not packing_agrees(model)


@pytest.mark.parametrize("arch,head", [("bert", "seq"), ("roberta", "seq"), ("bert", "token"), ("bert", "qa")])
def test_a_packed_mixed_pass_of_every_method_equals_the_padded_one(arch, head):
    adapters = _adapters(arch, head)
    names = list(adapters)
    tasks = names + ["__base__"] + names[::-1] + names[:5]
    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(2, 12, (len(tasks),), generator=g).tolist()
    mask = _mask(lengths, width=12)
    ids = torch.randint(3, 100, mask.shape, generator=g) * mask
    mt = MultiTaskModel(_base(arch, head), adapters)
    assert Packing.of(mask) is not None
    with torch.no_grad():
        padded = mt(input_ids=ids, attention_mask=mask, task_ids=tasks).outputs
        packed_out = mt(input_ids=ids, attention_mask=mask, task_ids=tasks, pack=True).outputs
    keys = ("start_logits", "end_logits") if head == "qa" else ("logits",)
    for key in keys:
        got, want = packed_out[key], padded[key]
        if got.dim() == 3 or head == "qa":  # per token: the real tokens only
            real = mask.bool()
            got, want = got[real], want[real]
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got))
        assert (got[finite] - want[finite]).abs().max().item() <= 1e-5, key


def test_packing_leaves_no_hook_behind():
    model = _base("bert", "seq")
    encoder = encoder_of(model)
    packing = Packing.of(_mask([3, 2, 1]), row_tokens=6)
    with packed(model, packing):
        assert encoder._forward_pre_hooks and encoder._forward_hooks
    assert not encoder._forward_pre_hooks and not encoder._forward_hooks


def test_a_bfloat16_model_is_checked_to_its_own_precision():
    assert packing_agrees(_base("bert", "seq").to(torch.bfloat16))
