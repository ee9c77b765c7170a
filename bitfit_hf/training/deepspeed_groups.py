"""DeepSpeed's own optimizer (a config ``"optimizer"`` block) trains exactly the method's parameter groups (their
per-role rates and weight decay), or is refused."""

from __future__ import annotations

import logging
from typing import Any

from bitfit_hf.training.launch_checks import LaunchError, check_deepspeed_optimizer, deepspeed_config

logger = logging.getLogger("bitfit_hf")


def keep_trained_groups_in_deepspeed_optimizer(trainer, dummy) -> Any:
    """Give DeepSpeed's own optimizer (a config ``"optimizer"`` block) the method's parameter groups.

    ``transformers`` hands DeepSpeed every parameter that requires grad as one group, so the config's
    ``weight_decay`` would hit every bias and ``bias_learning_rate`` / ``head_learning_rate`` would be
    lost. This replaces that list by the method's groups (each with its ``lr`` and ``weight_decay``), after
    checking that they hold exactly the same tensors; DeepSpeed builds the optimizer type its config
    names over them. Returns ``dummy``.
    """
    from bitfit_hf.tuners.state import unwrap

    check_deepspeed_optimizer(trainer)
    groups = [{k: v for k, v in group.items() if k != "name"} for group in trainer.trained_parameter_groups(unwrap(trainer.model))]
    ours = {id(p) for group in groups for p in group["params"]}
    given = dummy.params
    given_params = [p for item in given for p in (item["params"] if isinstance(item, dict) else [item])]
    theirs = {id(p) for p in given_params}
    if ours != theirs:
        names = {id(p): n for n, p in unwrap(trainer.model).named_parameters()}
        extra = sorted(names.get(i, "?") for i in theirs - ours)[:5]
        missing = sorted(names.get(i, "?") for i in ours - theirs)[:5]
        raise LaunchError(
            "The DeepSpeed config brings its own \"optimizer\" block, and the parameters DeepSpeed would train "
            f"differ from BitFit's selection (not selected: {extra}; selected but missing: {missing}). Refusing "
            "to train something else: remove the \"optimizer\" block (BitFitTrainer then builds the optimizer "
            "from TrainingArguments) or fix requires_grad."
        )
    # transformers already filled the block's "auto" lr / weight_decay from TrainingArguments (and
    # refuses explicit values that differ), so each group's own lr / weight_decay is what a
    # single-process BitFitTrainer would use.
    config = deepspeed_config(trainer) or {}
    dummy.params = groups
    if trainer.is_world_process_zero():
        logger.info(
            "DeepSpeed builds its %s optimizer over BitFit's %d parameter groups (%d tensors).",
            (config.get("optimizer") or {}).get("type", "configured"),
            len(groups),
            len(ours),
        )
    return dummy


def is_deepspeed_dummy_optimizer(optimizer) -> bool:
    """Whether ``optimizer`` is accelerate's placeholder for the optimizer a DeepSpeed config block builds."""
    return type(optimizer).__name__ == "DummyOptim" and hasattr(optimizer, "params")
