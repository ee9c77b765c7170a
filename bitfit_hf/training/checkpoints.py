"""Which Trainer checkpoints are complete, so that resuming never picks a half-written one.

``Trainer`` writes a checkpoint as many files into ``checkpoint-N/`` (adapter, optimizer, scheduler, RNG
states, ``trainer_state.json``); a process killed in between leaves a folder that looks like the newest
checkpoint but cannot be resumed. :class:`~bitfit_hf.training.trainer.BitFitTrainerBase` therefore removes
``checkpoint_complete.json`` before writing a checkpoint and writes it (atomically) after every process
has finished, and ``resume_from_checkpoint=True`` / ``--resume_from_checkpoint last`` take the newest
checkpoint that has it. Folders written before the marker existed (no checkpoint of the run has one)
count as complete when their ``trainer_state.json`` parses.

A checkpoint only resumes the run that wrote it: :func:`check_resume_config` refuses one trained with another
method or selection (naming both, as the recipes' flags), before anything is loaded or written.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from bitfit_hf.utils.constants import CHECKPOINT_COMPLETE_NAME, WEIGHTS_NAME, __version__
from bitfit_hf.utils.errors import UserError
from bitfit_hf.utils.io import write_json_atomic

logger = logging.getLogger("bitfit_hf")

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"


class CheckpointError(UserError, ValueError):
    """No checkpoint to resume from, or the one named is incomplete."""


def checkpoints(folder: str) -> List[Tuple[int, str]]:
    """``(step, path)`` of every ``checkpoint-N`` folder in ``folder``, oldest first."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = [(int(m.group(1)), os.path.join(folder, n)) for n in names if (m := _CHECKPOINT.match(n))]
    return sorted((step, path) for step, path in found if os.path.isdir(path))


def has_marker(path: str) -> bool:
    return os.path.isfile(os.path.join(path, CHECKPOINT_COMPLETE_NAME))


def _state_parses(path: str) -> bool:
    try:
        with open(os.path.join(path, TRAINER_STATE), encoding="utf-8") as handle:
            return isinstance(json.load(handle), dict)
    except (OSError, ValueError):
        return False


def is_complete(path: str) -> bool:
    """Whether ``path`` (a ``checkpoint-N`` folder) was fully written."""
    if has_marker(path):
        return True
    siblings = checkpoints(os.path.dirname(os.path.abspath(path)))
    if any(has_marker(p) for _, p in siblings):
        return False  # this run marks its checkpoints: an unmarked one was interrupted
    return _state_parses(path)  # written before markers existed


def last_complete_checkpoint(folder: str) -> Optional[str]:
    """The newest complete checkpoint in ``folder`` (``None`` when there is none); logs the newer,
    incomplete ones it skips."""
    found = checkpoints(folder)
    marked = any(has_marker(p) for _, p in found)
    skipped = []
    for _, path in reversed(found):
        if has_marker(path) or (not marked and _state_parses(path)):
            if skipped:
                logger.warning("Skipping incomplete checkpoint(s) %s (interrupted while being written); resuming from %s.",
                               ", ".join(os.path.basename(p) for p in skipped), path)
            return path
        skipped.append(path)
    return None


def resolve_resume_checkpoint(value, output_dir: str) -> Optional[str]:
    """The checkpoint folder ``Trainer.train(resume_from_checkpoint=value)`` should load: ``True``
    means the newest complete one in ``output_dir``; a path must be a complete checkpoint."""
    if value is None or value is False:
        return None
    if value is True:
        path = last_complete_checkpoint(output_dir)
        if path is None:
            incomplete = [os.path.basename(p) for _, p in checkpoints(output_dir)]
            raise CheckpointError(
                f"no complete checkpoint to resume from in {output_dir!r}"
                + (f" ({', '.join(incomplete)} {'was' if len(incomplete) == 1 else 'were'} interrupted while being "
                   "written)" if incomplete else "")
                + ". Start without --resume_from_checkpoint, or point it at a complete checkpoint folder."
            )
        return path
    path = str(value)
    if not os.path.isdir(path):
        raise CheckpointError(f"no checkpoint folder {path!r} to resume from: pass an existing checkpoint-N folder, or 'last'.")
    if _CHECKPOINT.match(os.path.basename(os.path.normpath(path))) and not is_complete(path):
        last = last_complete_checkpoint(os.path.dirname(os.path.abspath(path)))
        raise CheckpointError(
            f"{path!r} is incomplete (interrupted while being written): resume from "
            + (f"{last!r} or " if last else "")
            + "'last' (the newest complete checkpoint)."
        )
    return path


def clear_marker(path: str) -> None:
    """Before (re)writing ``path``: it is not complete until :func:`mark_complete` says so."""
    try:
        os.remove(os.path.join(path, CHECKPOINT_COMPLETE_NAME))
    except FileNotFoundError:
        pass


def mark_complete(path: str, global_step: int) -> None:
    """The last file of a checkpoint, written once every other file is on disk."""
    write_json_atomic(os.path.join(path, CHECKPOINT_COMPLETE_NAME),
                      {"global_step": int(global_step), "library": "bitfit-hf", "library_version": __version__})


# --------------------------------------------------------------------------- resuming the right run

#: The recipe flags of the config fields that decide what a run trains (a resume must keep them).
_FLAGS = {"bias_terms": "--bias_terms", "patterns": "--bias_patterns", "train_head": "--train_head",
          "add_missing_biases": "--add_missing_biases"}


def _selection_fields(config: Any, method: str) -> Dict[str, Any]:
    """``{flag: value}`` of the fields that decide what ``config`` (a method config or an adapter config) trains;
    learning rates, dropout and saving options are left out (a resume may change them)."""
    from bitfit_hf.tuners import METHODS
    from bitfit_hf.tuners.registry import method_fields

    spec = METHODS.get(method)
    renamed = dict(spec.flags) if spec is not None else {}  # the method's own spelling of a field's flag
    found: Dict[str, Any] = {}
    for key, flag in _FLAGS.items():
        value = getattr(config, key, None)
        if value is not None:
            flag = renamed.get(key, flag)
            found[flag] = [value] if isinstance(value, str) else value
    extra = method_fields(config)
    for key, value in (extra or {}).items():
        if "learning_rate" in key or "dropout" in key or key in ("head_modules", "save_full_model"):
            continue
        found[f"--{key}"] = value
    return found


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) or "(none)"
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_resume_config(path: str, config: Any) -> None:
    """Refuse to resume from ``path`` (a checkpoint folder) when it was trained with another method or another
    selection than ``config`` (the run's method config), with an error naming both as the recipes' flags.

    Reads the checkpoint's recorded adapter config only: no model is needed, so the recipes call it before
    loading anything. A full-model checkpoint (``--method full`` / ``--save_full_model``) resumes only such a
    run."""
    from bitfit_hf.adapters.adapter import BitFitAdapter
    from bitfit_hf.tuners import method_label

    name = f"the checkpoint {os.path.basename(os.path.normpath(path))}"
    full_run = bool(getattr(config, "is_full_finetuning", False) or getattr(config, "save_full_model", False))
    if not os.path.isfile(os.path.join(path, WEIGHTS_NAME)):
        if full_run:
            return
        raise CheckpointError(f"{name} holds a full model (--method full or --save_full_model); this run asks for "
                              f"--method {method_label(config)} and saves an adapter. {_AFRESH}")
    check_same_training(BitFitAdapter.from_directory(path).config, config, name)


_AFRESH = ("Resume with the checkpoint's --method and flags, or start afresh (another --output_dir, or "
           "--overwrite_output_dir).")


def check_same_training(recorded: Any, config: Any, subject: str, advice: str = _AFRESH,
                        error: type = CheckpointError) -> None:
    """``recorded`` (an adapter's config) was trained with the method and selection of ``config`` (a run's method
    config), else ``error`` naming both as the recipes' flags, about ``subject`` ("the checkpoint checkpoint-2",
    "--adapter_name_or_path 'x'"). Training on from an adapter of another method or selection would train a new
    selection over the loaded one and save an adapter without the loaded tensors."""
    from bitfit_hf.tuners import method_label

    asked = method_label(config)
    trained = method_label(recorded)
    full_run = bool(getattr(config, "is_full_finetuning", False) or getattr(config, "save_full_model", False))
    if full_run:
        raise error(f"{subject} holds a --method {trained} adapter; this run asks for --method {asked}"
                    + (" --save_full_model" if asked != "full" else "") + f" (a full model). {advice}")
    if trained != asked:
        raise error(f"{subject} was trained with --method {trained}; this run asks for --method {asked}. {advice}")
    theirs, ours = _selection_fields(recorded, recorded.method), _selection_fields(config, recorded.method)
    for flag, value in ours.items():
        if flag in theirs and theirs[flag] != value:
            raise error(f"{subject} was trained with {flag} {_shown(theirs[flag])}; this run asks for {flag} "
                        f"{_shown(value)}. {advice}")
