"""The one error type the recipes raise for bad input (before any training starts)."""

from __future__ import annotations

from bitfit_hf.utils.errors import UserError

__all__ = ["RecipeError"]


class RecipeError(UserError, ValueError):
    """Bad input to a recipe: unknown task, missing column, label outside the label set, empty split,
    a model without the needed head, conflicting flags. The message says what is wrong and how to fix
    it; the recipes' command-line entry points print it and exit with status 2."""
