"""The gradient mask zeroes exactly the untrained entries and follows the gradient's device (a model
prepared on the CPU, then moved to a GPU by the Trainer, must still train)."""

import torch

from bitfit_hf.tuners.grad_mask import GradMask


def test_mask_keeps_only_the_selected_entries_and_blocks_nan_outside():
    keep = torch.tensor([[True, False], [False, True]])
    grad = torch.tensor([[1.0, float("nan")], [float("inf"), -2.0]])
    out = GradMask(keep)(grad)
    assert torch.equal(out, torch.tensor([[1.0, 0.0], [0.0, -2.0]]))


def test_mask_follows_the_gradient_to_another_device():
    hook = GradMask(torch.tensor([True, False, True]))  # built on the CPU, as when a method is applied
    out = hook(torch.ones(3, device="meta", dtype=torch.bfloat16))  # the gradient arrives elsewhere
    assert out.device.type == "meta" and out.dtype == torch.bfloat16
    assert hook.keep.device.type == "meta"  # moved once and kept there, not copied every step


def test_hook_on_a_parameter_masks_its_gradient():
    param = torch.nn.Parameter(torch.zeros(4))
    param.register_hook(GradMask(torch.tensor([False, True, True, False])))
    (param * torch.arange(1.0, 5.0)).sum().backward()
    assert torch.equal(param.grad, torch.tensor([0.0, 2.0, 3.0, 0.0]))
