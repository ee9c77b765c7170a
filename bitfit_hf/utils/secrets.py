"""Keep credentials out of everything bitfit-hf writes: run records, adapter metadata, model cards, logs.

Two rules, applied together:

* by name: a value stored under a key (or given to a command-line flag) whose last word is ``token``,
  ``password``, ``passwd``, ``secret`` or ``api_key`` (``hub_token``, ``--hub_token``,
  ``use_auth_token``, ``--password=...``) is replaced, unless it is ``None`` or a boolean;
* by shape: any text that looks like a Hugging Face token (``hf_`` or ``api_org_`` followed by 16 or
  more letters and digits) is replaced wherever it appears, e.g. inside a command line or a message.
"""

from __future__ import annotations

import logging
import re
from typing import Any, List, Sequence

REDACTED = "<redacted>"

_TOKEN_TEXT = re.compile(r"\b(?:hf|api_org)_[A-Za-z0-9]{16,}")
_SECRET_WORDS = {"token", "password", "passwd", "secret", "apikey", "api_key"}


def is_secret_name(name: str) -> bool:
    """Whether a key or flag name holds a credential (``hub_token``, ``--password``); not
    ``tokenizer_name`` or ``pad_token_id``."""
    words = [w for w in re.split(r"[^a-z0-9]+", str(name).lower().lstrip("-")) if w]
    if not words:
        return False
    return words[-1] in _SECRET_WORDS or "_".join(words[-2:]) in _SECRET_WORDS


def redact_text(text: str) -> str:
    """``text`` with every token-shaped substring replaced."""
    return _TOKEN_TEXT.sub(REDACTED, text)


def redact_argv(argv: Sequence[str]) -> List[str]:
    """A command line with the values of secret flags (``--hub_token X``, ``--token=X``) and any
    token-shaped text replaced."""
    out: List[str] = []
    hide_next = False
    for item in map(str, argv):
        if hide_next and not item.startswith("--"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        flag, eq, value = item.partition("=")
        if item.startswith("-") and is_secret_name(flag):
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(item)
                hide_next = True
            continue
        out.append(redact_text(item))
    return out


def redact(value: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, strings) with every credential replaced."""
    if isinstance(value, dict):
        return {k: (REDACTED if _hides(k, v) else redact(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [redact(v) for v in value]
        return type(value)(items) if isinstance(value, tuple) else items
    if isinstance(value, str):
        return redact_text(value)
    return value


def _hides(key: Any, value: Any) -> bool:
    return is_secret_name(str(key)) and value is not None and not isinstance(value, bool) and value != ""


class SecretStr(str):
    """A credential that works as the string it is, but pickles (``torch.save``, ``copy.copy`` across
    processes) as :data:`REDACTED`: ``Trainer`` pickles ``TrainingArguments`` into every full-model
    checkpoint (``training_args.bin``), ``hub_token`` included."""

    def __reduce__(self):
        return (str, (REDACTED,))

    def __reduce_ex__(self, protocol):
        return self.__reduce__()

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __repr__(self) -> str:
        return repr(REDACTED)


def protect_secret_fields(obj: Any) -> None:
    """Turn every string attribute of ``obj`` with a secret name (``hub_token``) into a :class:`SecretStr`."""
    for name, value in list(vars(obj).items()):
        if is_secret_name(name) and isinstance(value, str) and value and not isinstance(value, SecretStr):
            setattr(obj, name, SecretStr(value))


class RedactingFilter(logging.Filter):
    """A logging filter that replaces token-shaped text in every record it sees (install it on a handler)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is logging's problem, not ours
            return True
        cleaned = redact_text(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def install_log_redaction(*handlers: logging.Handler) -> None:
    """Add one :class:`RedactingFilter` to each handler (and to the root logger's handlers when none
    are given); idempotent."""
    targets = handlers or tuple(logging.getLogger().handlers)
    for handler in targets:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
