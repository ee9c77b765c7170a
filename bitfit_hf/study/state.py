"""Where a planned cell stands: its own module so the runner, the sweep and the tables share it without a cycle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from bitfit_hf.study.grid import Cell

__all__ = ["CellState", "NOT_AVAILABLE", "WAITING"]

NOT_AVAILABLE = "not run: method not available in this build"
#: A main cell whose learning rate the sweep has not chosen yet (its sweep cells are still to run).
WAITING = "waiting for the learning-rate sweep"


@dataclass
class CellState:
    """A planned cell and where it stands: ``done``, ``failed``, ``pending``, ``unavailable`` or ``waiting``."""

    cell: Cell
    cell_id: str
    status: str
    record: Optional[Dict[str, Any]] = None
