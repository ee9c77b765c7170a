"""What a ``/predict`` request may hold and what comes back, per task type; the work is done by
:mod:`bitfit_hf.inference`, the layer ``bitfit-hf predict`` and the pipelines use too.

``inputs`` follows text-embeddings-inference's ``/predict`` for every adapter: one input, or a batch written
``[["a"], ["a", "b"], ...]``; a plain list of texts is a batch where that is unambiguous (always for a tagger;
for a classifier unless it holds exactly two texts, which is ONE pair, as in TEI).

* classification: a text, or a pair ``[text, text]``. Answer per input: ``[{"label", "score"}]``, best first
  (softmax; sigmoid for multi-label adapters; the value for regression; logits with ``"raw_scores": true``).
* tagging (token classification): a text (no pairs). The text is split on white space; each word gets the
  tag of its first sub-token. Answer per input: ``{"tagged": "the/DT cat/NN", "spans": [{"word", "tag",
  "score", "start", "end"}], "untagged": [...]}`` (words past the length limit, with ``"truncate": true``).
* question answering: ``[question, context]`` or ``{"question", "context"}``. The context is read whole, in
  overlapping windows batched with other requests. Answer per input: ``{"answer", "score", "start", "end"}``
  (character offsets into the context); ``max_answer_len`` and ``handle_impossible_answer`` as in
  transformers' QA pipeline.
"""

from __future__ import annotations

from bitfit_hf.inference.inputs import InputRefused


class InputError(Exception):
    """A request the server answers with an error status and a one-line reason."""

    def __init__(self, status: int, message: str, error_type: str = "validation", **extra):
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.extra = extra
        self.adapter = None  # the served adapter the refused request named, once known


def refused(err: InputRefused) -> InputError:
    """The inference layer's refusal of an input, as the 422 a client gets."""
    return InputError(422, str(err))
