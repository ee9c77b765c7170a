"""The one error contract of bitfit-hf's command lines.

Every exception the library raises for input a user can fix (a bad adapter, a missing asset, a Hub
refusal, a bad recipe flag) derives from :class:`UserError` as well as from its usual built-in type.
The recipes and ``bitfit-hf`` print such an error as one ``error: ...`` line and exit with status 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from typing import Callable, TypeVar

from bitfit_hf.utils.secrets import redact_text

T = TypeVar("T")

EXIT_USER_ERROR = 2


class UserError(Exception):
    """Bad input; the message says what is wrong and how to fix it."""


def first_line(err: BaseException) -> str:
    """An exception's message cut to its first line (a ``KeyError``'s key without the quotes ``str`` adds),
    or its type's name when it has none: what a one-line refusal quotes."""
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    text = text.strip()
    return text.splitlines()[0] if text else type(err).__name__


def exit_on_user_error(run: Callable[[], T], prog: str) -> T:
    """Call ``run``; a :class:`UserError` becomes ``prog: error: message`` on stderr and exit status 2."""
    try:
        return run()
    except UserError as err:
        print(f"{prog}: error: {redact_text(str(err))}", file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR) from None
