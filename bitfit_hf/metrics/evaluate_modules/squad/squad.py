"""The SQuAD v1.1 metric as a local ``evaluate`` module: ``evaluate.load(<this file>)`` works offline.

Inputs and result keys are those of the Hub's ``squad`` metric (exact_match and f1, both 0-100); the
numbers come from :func:`bitfit_hf.metrics.squad.squad_v1_compute`, the official v1.1 script's rules.
"""

import datasets
import evaluate

from bitfit_hf.metrics.squad import squad_v1_compute

_DESCRIPTION = "SQuAD v1.1 exact match and F1 (answers normalised as the official script does), offline."

_INPUTS = """
Args:
    predictions: [{"id": str, "prediction_text": str}, ...]
    references: [{"id": str, "answers": {"text": [str, ...], "answer_start": [int, ...]}}, ...]
Returns:
    exact_match, f1: percentages over all references (an unanswered question scores 0).
"""

_CITATION = """@inproceedings{rajpurkar-etal-2016-squad,
  title={{SQ}u{AD}: 100,000+ Questions for Machine Comprehension of Text},
  author={Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy},
  booktitle={Proceedings of the 2016 Conference on Empirical Methods in Natural Language Processing},
  year={2016},
  pages={2383--2392}
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _INPUTS)
class Squad(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features(
                {
                    "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")},
                    "references": {
                        "id": datasets.Value("string"),
                        "answers": datasets.features.Sequence(
                            {"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}
                        ),
                    },
                }
            ),
        )

    def _compute(self, predictions, references):
        return squad_v1_compute(predictions=predictions, references=references)
