"""The metrics as ``evaluate`` modules shipped inside the package, loaded offline.

``evaluate.load("glue", "sst2")`` fetches the metric script from the Hub; the same metrics live here as
local modules (``bitfit_hf/metrics/evaluate_modules/<name>/<name>.py``), so ``evaluate.load`` reads them
from disk: no network, and nothing written outside the Hugging Face modules cache (where ``evaluate``
copies every module it imports). The recipes compute their metrics through :func:`load_metric`.
"""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["METRIC_MODULES", "metric_module_path", "load_metric"]

_MODULES_DIR = Path(__file__).resolve().parent / "evaluate_modules"

#: The packaged modules: GLUE (config = task), SQuAD v1.1, word-level token accuracy.
METRIC_MODULES = ("glue", "squad", "token_accuracy")


def metric_module_path(name: str) -> str:
    """The file ``evaluate.load`` takes for the packaged metric ``name`` (one of :data:`METRIC_MODULES`)."""
    if name not in METRIC_MODULES:
        raise KeyError(f"unknown packaged metric {name!r}; choose one of {list(METRIC_MODULES)}")
    return str(_MODULES_DIR / name / f"{name}.py")


@functools.lru_cache(maxsize=None)
def load_metric(name: str, config_name: str | None = None):
    """``evaluate.load`` of a packaged metric, kept in memory (no Arrow cache files); loaded once per process."""
    import evaluate

    return evaluate.load(metric_module_path(name), config_name, keep_in_memory=True)
