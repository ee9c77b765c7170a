"""The operating system's name of the calling thread, so a server's CPU can be read per thread (``top -H``,
``ps -L``, ``/proc/<pid>/task/<tid>/comm``): Python's own thread names stay inside the interpreter."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Optional

_PR_SET_NAME = 15  # prctl(2)
MAX_NAME_BYTES = 15  # the kernel keeps 16 bytes, the terminating NUL included


@functools.lru_cache(maxsize=1)
def _libc() -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def name_os_thread(name: str) -> bool:
    """Give the calling thread ``name`` (cut to 15 bytes) in the OS; threads it starts later (torch's OpenMP
    threads, say) are born with it. False, and nothing changed, where the OS has no such call (not Linux)."""
    libc = _libc() if sys.platform.startswith("linux") else None
    if libc is None:
        return False
    return libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode("utf-8")[:MAX_NAME_BYTES]), 0, 0, 0) == 0
