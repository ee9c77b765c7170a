"""The learning-rate sweep's choice: per task and row, the rate the main runs train at.

The paper chose each method's rate per task on held-out data; here each swept row runs at a few rates on
a dev split carved from the training data (never the validation examples the claims are judged on), and
the rate with the best mean dev score wins. The choice is only made once every rate's cells are finished,
so it never changes under the main runs that use it.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Sequence, Tuple

from bitfit_hf.study.budgets import Budget
from bitfit_hf.study.grid import SWEEP, swept_rows
from bitfit_hf.study.state import NOT_AVAILABLE, CellState

__all__ = ["CHOICE_RULE", "CHOSEN", "choose_rates", "chosen_rates"]

CHOSEN = "chosen"

CHOICE_RULE = (
    "learning rates: per task and row, the rate with the highest mean dev score over the sweep's seeds (ties: the "
    "lower rate), the dev split being the last training examples (never the validation examples); the choice waits "
    "until every rate's runs have finished (failed ones are left out and named); a choice at the smallest or largest "
    "rate tried is flagged, since the best rate may lie beyond the grid"
)


def _rate_entry(rate: float, states: Sequence[CellState]) -> Dict[str, Any]:
    done = [s.record for s in states if s.status == "done"]
    return {
        "rate": rate,
        "runs": [{"seed": r["seed"], "score": r["score"], "final_train_loss": r.get("final_train_loss")} for r in done],
        "mean": statistics.fmean(r["score"] for r in done) if done else None,
        "failed": [s.cell_id for s in states if s.status == "failed"],
    }


def choose_rates(states: Sequence[CellState], budget: Budget) -> Dict[Tuple[str, str], Dict[str, Any]]:
    """(task, row) -> the sweep's table for that row: each rate's dev scores, the status (``chosen``,
    ``waiting``, ``failed``, or not available) and the ``chosen`` rate with ``edge`` (at the grid's edge)."""
    groups: Dict[Tuple[str, str], Dict[float, List[CellState]]] = {}
    for state in states:
        cell = state.cell
        if cell.stage == SWEEP and cell.method in swept_rows(budget, cell.task):
            groups.setdefault((cell.task, cell.method), {}).setdefault(cell.learning_rate, []).append(state)
    out: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for (task, row), by_rate in groups.items():
        every = [s for group in by_rate.values() for s in group]
        rates = [_rate_entry(rate, by_rate[rate]) for rate in sorted(by_rate)]
        entry: Dict[str, Any] = {"task": task, "row": row, "rates": rates, "chosen": None, "edge": False,
                                 "dev_samples": every[0].cell.dev_samples, "seeds": sorted({s.cell.seed for s in every})}
        if all(s.status == "unavailable" for s in every):
            entry["status"] = NOT_AVAILABLE
        elif any(s.status in ("pending", "unavailable") for s in every):
            entry["status"] = "waiting"
        else:
            scored = [r for r in rates if r["mean"] is not None]
            if not scored:
                entry["status"] = "failed"
            else:
                best = max(scored, key=lambda r: (r["mean"], -r["rate"]))  # ties: the lower rate
                entry.update(status=CHOSEN, chosen=best["rate"],
                             edge=len(rates) > 1 and best["rate"] in (rates[0]["rate"], rates[-1]["rate"]))
        out[(task, row)] = entry
    return out


def chosen_rates(choices: Dict[Tuple[str, str], Dict[str, Any]]) -> Dict[Tuple[str, str], float]:
    """(task, row) -> the chosen rate, for the rows whose sweep has chosen."""
    return {key: entry["chosen"] for key, entry in choices.items() if entry["status"] == CHOSEN}
