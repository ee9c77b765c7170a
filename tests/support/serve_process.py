"""Reading a `bitfit-hf serve` subprocess's start-up output."""

from __future__ import annotations

import re
import time


def wait_for_listening_url(proc, timeout: float = 300) -> tuple:
    """Read ``proc``'s stderr up to its ``listening on URL`` line: ``(URL or None, the last line read)``."""
    url, line = None, ""
    until = time.monotonic() + timeout
    while url is None and time.monotonic() < until:
        line = proc.stderr.readline()
        if not line:
            break
        found = re.search(r"listening on (http://\S+)", line)
        url = found.group(1) if found else None
    return url, line
