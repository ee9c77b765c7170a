"""The recipes' fast path (``--fast_path auto|on|off``): whether compiling the training step pays for the run in
hand, whether CUDA graphs are safe in it, and setting it up with the flags transformers already has.

On: ``torch_compile``, batches padded to a few lengths (:class:`~bitfit_hf.training.static_shapes.BucketPadding`,
the maximum length always one of them) and the last partial training batch dropped (``drop_last_train_batch``:
evaluation keeps every example), so each shape is compiled once. The mode is ``reduce-overhead`` (CUDA graphs)
only on a CUDA run where graphs are safe, plain Inductor (``default``) otherwise. CUDA graphs are unsafe with
gradient accumulation (the first micro-batch's gradients are graph outputs that the next replay overwrites), under
DDP (the compiled evaluation wrapper stops transformers from wrapping the model), FSDP and DeepSpeed (their own
engines); :func:`graph_hazards` names them.

``auto`` turns it on for a CUDA run with no such hazard whose planned optimizer steps reach the break-even:
:data:`BREAK_EVEN_STEPS_PER_SHAPE` for each shape the run compiles (one per length bucket). A user's own
``--torch_compile True`` keeps the user's mode (torch's ``default`` when none is given): it is never switched to
CUDA graphs. Evaluation and prediction run the uncompiled module (``BitFitTrainer``), so they add no shape.
docs/speed.md has the measurements behind the break-even and how to choose by hand.
"""

from __future__ import annotations

import logging
import math
from typing import Any, List, NamedTuple, Optional, Tuple

from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.training.launcher import env_true, launched_world_size
from bitfit_hf.training.static_shapes import BucketPadding, length_buckets, parse_buckets

logger = logging.getLogger("bitfit_hf")

#: Optimizer steps from which one compiled shape pays on a GPU: about 30 s of compilation over the 19 ms a BERT-base
#: step at batch 32 saved under CUDA graphs with transformers' stock compile flags (one H200; docs/speed.md). A run
#: compiles once per length bucket, so its break-even is this times its buckets.
BREAK_EVEN_STEPS_PER_SHAPE = 1500
#: The break-even of a run that compiles one shape.
BREAK_EVEN_STEPS = BREAK_EVEN_STEPS_PER_SHAPE

#: Compiled graphs dynamo keeps per function: one per training bucket, with room to spare.
GRAPHS_PER_FUNCTION = 64

CUDA_GRAPHS = "reduce-overhead"
PLAIN_COMPILE = "default"


class FastPathChoice(NamedTuple):
    """What :func:`decide` chose: ``on``, the ``torch.compile`` ``mode`` when on, and ``why`` in words."""

    on: bool
    mode: Optional[str]
    why: str


def planned_steps(training_args, num_train_examples: Optional[int]) -> Optional[int]:
    """The run's optimizer steps (``--max_steps``, else epochs over the training set), or None when unknown."""
    if getattr(training_args, "max_steps", -1) and training_args.max_steps > 0:
        return training_args.max_steps
    if not num_train_examples:
        return None
    per_step = (training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
                * max(1, getattr(training_args, "world_size", 1)))
    return math.ceil(training_args.num_train_epochs * math.ceil(num_train_examples / per_step))


def graph_hazards(training_args) -> List[str]:
    """Why CUDA graphs are unsafe in this run (empty: they are safe): gradient accumulation, DDP, FSDP, DeepSpeed.
    ``accelerate launch`` configurations count as well as the flags."""
    hazards = []
    if getattr(training_args, "gradient_accumulation_steps", 1) > 1:
        hazards.append(f"gradient accumulation ({training_args.gradient_accumulation_steps} micro-batches: the "
                       "first one's gradients are graph outputs the next replay overwrites)")
    if getattr(training_args, "deepspeed", None) or env_true("ACCELERATE_USE_DEEPSPEED"):
        hazards.append("DeepSpeed (its own engine)")
    if getattr(training_args, "fsdp", None) or env_true("ACCELERATE_USE_FSDP"):
        hazards.append("FSDP (its own wrapping)")
    elif getattr(training_args, "world_size", 1) > 1 or launched_world_size() > 1:
        hazards.append("DDP (several processes)")
    return hazards


def decide(training_args, num_train_examples: Optional[int], cuda: bool, shapes: int = 1) -> FastPathChoice:
    """The fast path for this run: on or off, the compile mode, and why. ``shapes``: how many batch shapes the
    compiled step will see (its length buckets), each compiled once."""
    choice = getattr(training_args, "fast_path", "off") or "off"
    user_mode = getattr(training_args, "torch_compile_mode", None)
    hazards = graph_hazards(training_args) if cuda else []
    if choice == "off":
        return FastPathChoice(False, None, "--fast_path off")
    if choice == "on" or training_args.torch_compile:
        source = "--fast_path on" if choice == "on" else "--torch_compile True"
        if user_mode:
            if user_mode == CUDA_GRAPHS and hazards:
                logger.warning("--torch_compile_mode %s records CUDA graphs, which are unsafe with %s: expect a crash "
                               "or wrong gradients (leave the mode out to compile without graphs).", user_mode,
                               "; ".join(hazards))
            return FastPathChoice(True, user_mode, f"{source}, the mode given by --torch_compile_mode")
        if choice != "on":  # the user's compile: never switched to CUDA graphs behind their back
            return FastPathChoice(True, PLAIN_COMPILE, f"{source} with no --torch_compile_mode: torch's default mode")
        if not cuda:
            return FastPathChoice(True, PLAIN_COMPILE, f"{source}; no CUDA device, so no CUDA graphs")
        if hazards:
            return FastPathChoice(True, PLAIN_COMPILE, f"{source}; CUDA graphs off: unsafe with {'; '.join(hazards)}")
        return FastPathChoice(True, CUDA_GRAPHS, source)
    if not cuda:
        return FastPathChoice(False, None, "no CUDA device (CUDA graphs are what pays; --fast_path on compiles anyway)")
    if hazards:
        return FastPathChoice(False, None, f"CUDA graphs are unsafe with {'; '.join(hazards)} (--fast_path on compiles "
                                           "without them)")
    steps = planned_steps(training_args, num_train_examples)
    shapes = max(1, shapes)
    break_even = BREAK_EVEN_STEPS_PER_SHAPE * shapes
    if steps is None or steps < break_even:
        return FastPathChoice(False, None, (
            f"{steps if steps is not None else 'an unknown number of'} optimizer steps planned, fewer than the "
            f"{break_even} where compiling {shapes} shape(s) pays back (--fast_path on to compile anyway)"))
    return FastPathChoice(True, CUDA_GRAPHS, f"{steps} optimizer steps planned, at least the {break_even} where "
                                             f"compiling {shapes} shape(s) pays back")


def choose_buckets(training_args, max_length: int) -> Tuple[int, ...]:
    """The length buckets: ``--length_buckets`` (with ``max_length`` added when every bucket is shorter, so no batch
    falls outside them and compiles a shape of its own), else :func:`length_buckets`."""
    given = getattr(training_args, "length_buckets", None)
    if not given:
        return length_buckets(max_length)
    try:
        buckets = parse_buckets(given)
    except ValueError as err:
        raise RecipeError(str(err)) from None
    if buckets[-1] < max_length:
        logger.info("--length_buckets %s: %d (the maximum length) added, so longer batches share one shape.", given,
                    max_length)
        buckets = buckets + (max_length,)
    return buckets


def apply_fast_path(training_args, collator: Any, max_length: Optional[int], num_train_examples: Optional[int]) -> Any:
    """Decide (:func:`decide`), log the decision and its mode in one line, and when on set the compile flags, drop
    the last partial training batch (``drop_last_train_batch``, read by ``BitFitTrainer``) and return the collator
    padding to length buckets (``collator`` itself when off, or when it pads to one length already)."""
    import torch

    cuda = torch.cuda.is_available() and not getattr(training_args, "use_cpu", False)
    pads = hasattr(collator, "padding") and bool(max_length)  # default_data_collator: one shape already
    buckets: Tuple[int, ...] = choose_buckets(training_args, max_length) if pads else ()
    choice = decide(training_args, num_train_examples, cuda, shapes=len(buckets) or 1)
    if not choice.on:
        logger.info("Fast path off: %s.", choice.why)
        return collator
    training_args.torch_compile = True
    training_args.torch_compile_backend = training_args.torch_compile_backend or "inductor"
    training_args.torch_compile_mode = choice.mode
    training_args.drop_last_train_batch = True
    _keep_graphs_static()
    if buckets:
        collator = BucketPadding(collator, buckets)
    logger.info("Fast path on, torch.compile mode %s (%s): %s, last partial training batch dropped, evaluation "
                "uncompiled.", choice.mode, choice.why,
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
