"""Command lines and arguments files as the recipes read them: ``~`` expanded in path flags, transformers 4's
``--group_by_length`` spelled as transformers 5 does, ``.json`` / ``.yaml`` arguments files, the flags a command
line gives, and the task's name for the default output folder."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence

from bitfit_hf.recipe_kit.errors import RecipeError

__all__ = ["PATH_FLAGS", "expand_home", "expand_home_in_argv", "group_by_length_alias", "load_args_file", "given_keys",
           "to_argv", "task_label"]


def given_keys(argv: Sequence[str]) -> set:
    """Destination names of the flags present on a command line (``--no_x`` counts as ``x``)."""
    keys = set()
    for token in argv:
        if not token.startswith("--") or token == "--":
            continue
        name = token[2:].split("=", 1)[0].replace("-", "_")
        keys.add(name)
        if name.startswith("no_"):
            keys.add(name[3:])
    return keys


def to_argv(values: Dict[str, Any]) -> List[str]:
    """``{flag: value}`` as command-line tokens (lists as several values)."""
    out: List[str] = []
    for key, value in values.items():
        if isinstance(value, (list, tuple)):
            out += [f"--{key}", *map(str, value)]
        else:
            out += [f"--{key}", str(value)]
    return out


#: Flags whose value is a local path (or a Hub id, which never starts with ``~``): ``~`` is the home folder there,
#: also where the shell does not expand it (``--output_dir=~/runs/a``, a value in a .json / .yaml arguments file).
PATH_FLAGS = ("output_dir", "logging_dir", "model_name_or_path", "config_name", "tokenizer_name", "cache_dir",
              "adapter_name_or_path", "train_file", "validation_file", "test_file", "validation_mismatched_file",
              "test_mismatched_file", "resume_from_checkpoint", "deepspeed")


def expand_home(value: Any) -> Any:
    return os.path.expanduser(value) if isinstance(value, str) and value.startswith("~") else value


def expand_home_in_argv(argv: List[str]) -> List[str]:
    out: List[str] = []
    expect = False
    for token in argv:
        if expect and not token.startswith("--"):
            out.append(expand_home(token))
            expect = False
            continue
        expect = False
        if token.startswith("--"):
            name, eq, value = token[2:].partition("=")
            if name.replace("-", "_") in PATH_FLAGS:
                if eq:
                    token = f"--{name}={expand_home(value)}"
                else:
                    expect = True
        out.append(token)
    return out


def group_by_length_alias(argv: List[str], training_class: type) -> List[str]:
    """``--group_by_length`` (transformers 4's flag, what users know) as transformers 5 spells it:
    ``--train_sampling_strategy group_by_length``. Left alone where the training class still has the flag."""
    if "group_by_length" in getattr(training_class, "__dataclass_fields__", {}):
        return argv
    out: List[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, value = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        if name.replace("-", "_") != "group_by_length":
            out.append(token)
            i += 1
            continue
        if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 1
        i += 1
        if not eq and not value:
            value = "true"
        if group_by_length_on(value):
            out += ["--train_sampling_strategy", "group_by_length"]
    return out


def group_by_length_on(value: Any) -> bool:
    """A ``group_by_length`` value as a switch; anything but true / false is refused."""
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise RecipeError(f"--group_by_length {value!r}: give true or false (or use --train_sampling_strategy).")


def group_by_length_key(values: Dict[str, Any], training_class: type) -> Dict[str, Any]:
    """An arguments file's ``group_by_length`` key as transformers 5 spells it (see :func:`group_by_length_alias`)."""
    if "group_by_length" not in values or "group_by_length" in getattr(training_class, "__dataclass_fields__", {}):
        return values
    values = dict(values)
    if group_by_length_on(values.pop("group_by_length")):
        values["train_sampling_strategy"] = "group_by_length"
    return values


def load_args_file(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        if path.endswith(".json"):
            data = json.load(handle)
        else:
            import yaml

            data = yaml.safe_load(handle)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: an arguments file must hold a mapping of flag names to values.")
    return data


def task_label(argv: Sequence[str], file_values: Optional[Dict[str, Any]], applied: Dict[str, Any], recipe: str) -> str:
    """A short name for the default output directory: the task, the dataset or the training file."""
    def value_of(key):
        if file_values is not None:
            return file_values.get(key, applied.get(key))
        for i, token in enumerate(argv):
            name = token[2:].split("=", 1)[0].replace("-", "_") if token.startswith("--") else None
            if name == key:
                if "=" in token:
                    return token.split("=", 1)[1]
                if i + 1 < len(argv):
                    return argv[i + 1]
        return applied.get(key)

    for key in ("task_name", "dataset_config_name", "dataset_name", "train_file", "validation_file"):
        value = value_of(key)
        if value:
            base = os.path.basename(str(value).rstrip("/"))
            stem = base.split(".")[0] if key.endswith("_file") else base
            return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in stem) or recipe
    return "custom"
