"""``bitfit-hf train RECIPE [recipe flags...]``: run a recipe (glue, pos, squad, clm) from an installed package.

The recipes are scripts (``recipes/*.py`` in a checkout), and a pip install has no checkout: the wheel ships them as
package data under ``bitfit_hf/recipes/`` (a symlink to ``../recipes``, as ``bitfit_hf/model_cards`` is), so
``bitfit-hf train glue --method lora`` runs exactly what ``python recipes/glue.py --method lora`` runs. Every flag
after the recipe's name is the recipe's own (``bitfit-hf train glue --help`` is the recipe's help).
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

from bitfit_hf.cli.errors import CliError
from bitfit_hf.utils.errors import EXIT_USER_ERROR

#: The recipe scripts, in the order the help lists them.
RECIPES = ("glue", "pos", "squad", "clm")


def recipes_dir() -> Optional[Path]:
    """The folder holding the recipe scripts: the package's ``recipes/`` (the wheel's copy, or the checkout's
    symlink), else the checkout's ``recipes/`` next to the package (a checkout whose symlink did not survive)."""
    package = Path(__file__).resolve().parent.parent
    for folder in (package / "recipes", package.parent / "recipes"):
        if (folder / "glue.py").is_file():
            return folder
    return None


def recipe_path(name: str) -> Path:
    """The script of recipe ``name``; a one-line error for a name that is not a recipe or a script that is missing."""
    if name not in RECIPES:
        raise CliError(f"unknown recipe {name!r}; choose one of: {', '.join(RECIPES)} (bitfit-hf train --help).")
    folder = recipes_dir()
    path = folder / f"{name}.py" if folder is not None else None
    if path is None or not path.is_file():
        raise CliError(f"the recipe {name}.py is missing from this bitfit-hf install (looked in the package's "
                       "recipes/ and the source checkout's recipes/): reinstall bitfit-hf.")
    return path


def summaries() -> Dict[str, str]:
    """Each recipe's one-line summary: the first line of its docstring, read without importing it (fast help)."""
    folder = recipes_dir()
    out = {}
    for name in RECIPES:
        path = folder / f"{name}.py" if folder is not None else None
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) if path else None
        except (OSError, SyntaxError):
            doc = None
        out[name] = doc.strip().splitlines()[0] if doc else "(missing from this install)"
    return out


#: Where the recipes' summaries go in the epilog, filled in only when the help is printed.
LISTING = "{recipe listing}"


class _ListingFormatter(argparse.RawDescriptionHelpFormatter):
    """Reads the recipe scripts for their summaries when the help is printed, not when the parser is built: every
    ``bitfit-hf`` command builds every verb's parser."""

    def add_text(self, text):
        if text and LISTING in text:
            text = text.replace(LISTING, "\n".join(f"  {name:6s} {line}" for name, line in summaries().items()))
        super().add_text(text)


def register(verbs) -> None:
    parser = verbs.add_parser(
        "train", help="run a training recipe (glue, pos, squad, clm) with its own flags",
        description="Run one of the recipes shipped with bitfit-hf, every flag after its name passed to it unchanged:\n"
                    "`bitfit-hf train glue ...` is `python recipes/glue.py ...` in a source checkout.",
        epilog=f"recipes:\n{LISTING}\n\n"
               "`bitfit-hf train RECIPE --help` lists a recipe's flags (--method, the data flags, every TrainingArguments\n"
               "flag). Several processes or GPUs: accelerate launch \"$(bitfit-hf train --path glue)\" [flags...]",
        formatter_class=_ListingFormatter,
    )
    parser.add_argument("--path", action="store_true",
                        help="print the recipe script's path and exit (for `accelerate launch`, or to read it)")
    parser.add_argument("recipe", nargs="?", metavar="RECIPE", help=f"one of: {', '.join(RECIPES)}")
    parser.add_argument("recipe_args", nargs=argparse.REMAINDER, metavar="...",
                        help="the recipe's flags, passed on unchanged")
    parser.set_defaults(run=run, train_parser=parser)


def command(name: str, recipe_args: List[str]) -> List[str]:
    """The command line that runs recipe ``name``: this interpreter, the script, the flags as given."""
    return [sys.executable, str(recipe_path(name)), *recipe_args]


def run(args: argparse.Namespace) -> int:
    if args.recipe is None:
        args.train_parser.print_help(sys.stderr)
        return EXIT_USER_ERROR
    argv = command(args.recipe, list(args.recipe_args))
    if args.path:
        print(argv[1])
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    env = {**os.environ, "BITFIT_HF_PROG": f"bitfit-hf train {args.recipe}"}  # the recipe's usage and error lines
    if os.name != "posix":  # pragma: no cover - Windows has no exec that keeps the process id
        return subprocess.call(argv, env=env)
    os.execve(argv[0], argv, env)  # become the recipe: its exit status, signals (Ctrl-C, SIGTERM) and output, unchanged
    return 0  # not reached
