"""Parameter and module names: the one test of "does this name belong to that module"."""

from __future__ import annotations

from typing import Iterable


def is_under(name: str, modules: Iterable[str]) -> bool:
    """Whether ``name`` is one of ``modules`` or lies inside one (``classifier.weight`` under ``classifier``)."""
    return any(name == m or name.startswith(m + ".") for m in modules)
