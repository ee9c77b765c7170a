"""Offline metrics equal to the official definitions (no Hub metric scripts needed).

Plain numpy/scipy; scikit-learn is not required.
"""

from bitfit_hf.metrics.glue import GLUE_METRIC_CONFIGS, GLUE_TASKS, GlueTask, glue_compute
from bitfit_hf.metrics.squad import normalize_answer, squad_v1_compute
from bitfit_hf.metrics.tokens import token_accuracy

__all__ = [
    "GLUE_METRIC_CONFIGS",
    "GLUE_TASKS",
    "GlueTask",
    "glue_compute",
    "normalize_answer",
    "squad_v1_compute",
    "token_accuracy",
]
