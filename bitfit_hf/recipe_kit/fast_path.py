"""The recipes' fast path (``--fast_path auto|on|off``): whether compiling the training step pays for the run in
hand, and setting it up with the flags transformers already has.

On: ``torch_compile`` with ``torch_compile_mode="reduce-overhead"`` (CUDA graphs; plain Inductor on a CPU, where
there are none), batches padded to a few lengths (:class:`~bitfit_hf.training.static_shapes.BucketPadding`) and
the last partial training batch dropped (``drop_last_train_batch``: evaluation keeps every example), so each
shape is compiled and captured once.
``auto`` turns it on for a CUDA run whose planned optimizer steps reach :data:`BREAK_EVEN_STEPS`: compiling
costs tens of seconds once, and a shorter run would spend more on it than it saves. ``--torch_compile True``
given by the user counts as on (without buckets each new batch length would compile again). docs/speed.md has
the measurements behind the break-even and how to choose by hand.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional, Tuple

from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.training.static_shapes import BucketPadding, length_buckets, parse_buckets

logger = logging.getLogger("bitfit_hf")

#: Optimizer steps from which compiling pays on a GPU: about 30 s of compilation over the 19 ms a BERT-base step
#: at batch 32 saved under CUDA graphs with transformers' stock compile flags (one H200; docs/speed.md). The fast
#: path's own break-even is what benchmarks/gpu_summary.py measures.
BREAK_EVEN_STEPS = 1500

#: Compiled graphs dynamo keeps per function: train and eval for each bucket, and a last partial eval batch.
GRAPHS_PER_FUNCTION = 64


def planned_steps(training_args, num_train_examples: Optional[int]) -> Optional[int]:
    """The run's optimizer steps (``--max_steps``, else epochs over the training set), or None when unknown."""
    if getattr(training_args, "max_steps", -1) and training_args.max_steps > 0:
        return training_args.max_steps
    if not num_train_examples:
        return None
    per_step = (training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
                * max(1, getattr(training_args, "world_size", 1)))
    return math.ceil(training_args.num_train_epochs * math.ceil(num_train_examples / per_step))


def decide(training_args, num_train_examples: Optional[int], cuda: bool) -> Tuple[bool, str]:
    """``(on, why)`` for this run."""
    choice = getattr(training_args, "fast_path", "off") or "off"
    if choice == "off":
        return False, "--fast_path off"
    if choice == "on":
        return True, "--fast_path on"
    if training_args.torch_compile:
        return True, "--torch_compile True"
    if not cuda:
        return False, "no CUDA device (CUDA graphs are what pays; --fast_path on compiles anyway)"
    if getattr(training_args, "deepspeed", None):
        return False, "DeepSpeed runs its own engine (--fast_path on to try it)"
    steps = planned_steps(training_args, num_train_examples)
    if steps is None or steps < BREAK_EVEN_STEPS:
        return False, (f"{steps if steps is not None else 'an unknown number of'} optimizer steps planned, fewer than "
                       f"the {BREAK_EVEN_STEPS} where compiling pays back (--fast_path on to compile anyway)")
    return True, f"{steps} optimizer steps planned (compiling pays back after about {BREAK_EVEN_STEPS})"


def apply_fast_path(training_args, collator: Any, max_length: Optional[int], num_train_examples: Optional[int]) -> Any:
    """Decide (:func:`decide`), log the decision in one line, and when on set the compile flags, drop the last
    partial training batch (``drop_last_train_batch``, read by ``BitFitTrainer``) and return the collator padding
    to length buckets (``collator`` itself when off, or when it pads to one length already)."""
    import torch

    cuda = torch.cuda.is_available() and not getattr(training_args, "use_cpu", False)
    on, why = decide(training_args, num_train_examples, cuda)
    if not on:
        logger.info("Fast path off: %s.", why)
        return collator
    training_args.torch_compile = True
    training_args.torch_compile_backend = training_args.torch_compile_backend or "inductor"
    if training_args.torch_compile_mode is None:
        training_args.torch_compile_mode = "reduce-overhead" if cuda else "default"
    training_args.drop_last_train_batch = True
    _keep_graphs_static()
    buckets: Tuple[int, ...] = ()
    if hasattr(collator, "padding") and max_length:  # a padding collator (default_data_collator: one shape already)
        try:
            buckets = (parse_buckets(training_args.length_buckets) if getattr(training_args, "length_buckets", None)
                       else length_buckets(max_length))
        except ValueError as err:
            raise RecipeError(str(err)) from None
        collator = BucketPadding(collator, buckets)
    logger.info("Fast path on (%s): torch.compile mode %s, %s, last partial training batch dropped.", why,
                training_args.torch_compile_mode,
                f"batches padded to {'/'.join(map(str, buckets))} tokens" if buckets else "one batch length")
    return collator


def _keep_graphs_static() -> None:
    """One specialised graph per bucket rather than one dynamic-shape graph (slower kernels, and CUDA graphs record
    per shape anyway), and room for all of them."""
    import torch._dynamo

    torch._dynamo.config.automatic_dynamic_shapes = False
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), GRAPHS_PER_FUNCTION))
