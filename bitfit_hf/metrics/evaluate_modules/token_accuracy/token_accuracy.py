"""Word-level token accuracy for tagging as a local ``evaluate`` module (POS, chunk or NER tags as classes).

``evaluate.load(<this file>).compute(predictions=ids, references=ids)`` with one row of tag ids per
sentence; positions whose reference is ``ignore_index`` (-100: padding, non-first sub-tokens) are left
out. The number comes from :func:`bitfit_hf.metrics.tokens.token_accuracy`.
"""

import datasets
import evaluate

from bitfit_hf.metrics.tokens import token_accuracy

_DESCRIPTION = "Fraction of labelled token positions whose predicted tag id equals the gold one."

_INPUTS = """
Args:
    predictions: one list of predicted tag ids per sentence.
    references: one list of gold tag ids per sentence, as long as its prediction row.
    ignore_index: reference value of positions to leave out (default -100).
Returns:
    accuracy: correct / counted (nan when nothing is labelled).
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _INPUTS)
class TokenAccuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("int64")),
                    "references": datasets.Sequence(datasets.Value("int64")),
                }
            ),
        )

    def _compute(self, predictions, references, ignore_index=-100):
        return {"accuracy": token_accuracy(predictions, references, ignore_index=ignore_index)}
