"""The resumable results files of the benchmarks that run one recipe per cell (``lr_sweep``, ``method_defaults``,
``time_to_accuracy``): one JSON line per finished cell, appended and synced as the cell ends, so an interrupted run
loses at most the cell in progress and a second call skips the cells already there."""

from __future__ import annotations

import json
import os
from typing import Callable, Dict


def read_rows(path: str, key: Callable[[dict], str]) -> Dict[str, dict]:
    """The finished cells of ``path`` by ``key(row)`` (a later line with the same key wins); {} if there is none."""
    rows: Dict[str, dict] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    row = json.loads(line)
                    rows[key(row)] = row
    return rows


def append_row(path: str, row: dict) -> None:
    """Append one finished cell, flushed and synced."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
