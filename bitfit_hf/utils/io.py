"""Atomic file writes: a crash mid-save leaves the previous file in place, never half a file.

A write goes to a hidden temporary file beside the target (``.<name>.<host>-<pid>.<random>.tmp``),
is flushed to disk and renamed over the target in one step. A process killed before the rename leaves
its temporary file behind; the next atomic write into that folder removes it once its writer is known
to be gone (same host, process no longer running) or it is older than :data:`STALE_TEMP_SECONDS`, so a
concurrent writer's file is never pulled from under it. New files get the permissions a plain
``open()`` would give them (``0o666`` minus the umask), not ``mkstemp``'s private ``0o600``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional

STALE_TEMP_SECONDS = 6 * 3600
"""A temporary file of another host (or of a live process id) is stale after this long."""

_TEMP = re.compile(r"^\..+\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)\.[^.]*\.tmp$")
_LEGACY_TEMP = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")  # bitfit-hf <= 0.1.0: .<name>.<mkstemp>.tmp


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40] or "host"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists (another user's) or cannot tell: keep its file
    return True


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux ``/proc``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: the classic read-by-setting (briefly process-wide)
    os.umask(mask)
    return mask


def stale_temp_files(directory: str) -> List[str]:
    """The temporary files of interrupted atomic writes in ``directory`` (full paths)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    host, now, stale = _host(), time.time(), []
    for name in names:
        match = _TEMP.match(name)
        if match is None and not _LEGACY_TEMP.match(name):
            continue
        path = os.path.join(directory, name)
        try:
            age = now - os.path.getmtime(path)
        except OSError:
            continue
        dead_writer = match is not None and match["host"] == host and not _process_alive(int(match["pid"]))
        if dead_writer or age > STALE_TEMP_SECONDS:
            stale.append(path)
    return stale


def remove_stale_temp_files(directory: str) -> List[str]:
    """Remove what :func:`stale_temp_files` finds; returns the paths removed."""
    removed = []
    for path in stale_temp_files(directory):
        try:
            os.remove(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _fsync_directory(directory: str) -> None:
    """Make the rename itself durable (a power cut could otherwise lose it); best effort."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    remove_stale_temp_files(directory)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.{_host()}-{os.getpid()}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
        _fsync_directory(directory)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_bytes_atomic(path: str, data: bytes) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(data)


def write_text_atomic(path: str, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def read_json_object(path: Optional[str]) -> Optional[dict]:
    """The JSON object stored at ``path``, or ``None`` when it is missing, unreadable or not an object
    (optional side files such as ``trainable_summary.json`` must never break a load)."""
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
