"""The GLUE metric as a local ``evaluate`` module: ``evaluate.load(<this file>, "sst2")`` works offline.

Config names, input features and result keys are those of the Hub's ``glue`` metric; the numbers come
from :func:`bitfit_hf.metrics.glue.glue_compute` (checked against scikit-learn and SciPy in the tests).
"""

import datasets
import evaluate

from bitfit_hf.metrics.glue import GLUE_METRIC_CONFIGS, glue_compute

_DESCRIPTION = "The official metric of each GLUE task, computed offline by bitfit-hf."

_INPUTS = """
Args:
    predictions: predicted class ids (floats for stsb).
    references: gold class ids (floats for stsb).
Returns, by config:
    cola: matthews_correlation; stsb: pearson, spearmanr; mrpc, qqp: accuracy, f1 (of class 1);
    sst2, mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli, hans: accuracy.
"""

_CITATION = """@inproceedings{wang2019glue,
  title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and Bowman, Samuel R.},
  booktitle={International Conference on Learning Representations},
  year={2019}
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _INPUTS)
class Glue(evaluate.Metric):
    def _info(self):
        if self.config_name not in GLUE_METRIC_CONFIGS:
            raise KeyError(f"Unknown GLUE config {self.config_name!r}; choose one of {list(GLUE_METRIC_CONFIGS)}")
        dtype = "float32" if self.config_name == "stsb" else "int64"
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)}),
            format="numpy",
        )

    def _compute(self, predictions, references):
        return glue_compute(self.config_name, predictions, references)
