"""transformers' log messages held back for a moment, where they would mislead rather than inform."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def transformers_errors_only(active: bool = True) -> Iterator[None]:
    """Only transformers' errors are logged inside the block (its verbosity is put back after it);
    ``active=False`` changes nothing."""
    if not active:
        yield
        return
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
