"""Extractive question answering (SQuAD v1.1): windows over long contexts, span labels, n-best
post-processing, and a ``BitFitTrainer`` that scores answers rather than logits.

A context longer than ``max_seq_length`` is cut into overlapping windows ("features"): the question,
then a slice of the context, consecutive slices sharing ``doc_stride`` tokens. For training, a window
whose context slice holds the whole answer is labelled with the answer's first and last token; any
other window points at the CLS token (index 0). For evaluation each window keeps its example id and
the character offsets of its context tokens; post-processing scores every (start, end) pair among the
``n_best_size`` best starts and ends of every window of an example, skips pairs outside the context,
reversed or longer than ``max_answer_length`` tokens, and answers with the context text of the best
pair. Answers are scored with the official SQuAD v1.1 exact match and F1
(:func:`bitfit_hf.metrics.squad.squad_v1_compute`).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from bitfit_hf.hub.trainer import BitFitTrainer
from bitfit_hf.recipe_kit.errors import RecipeError
from bitfit_hf.training.collapse import CONSTANT_MIN_EXAMPLES, ConstantLoss, label_entropy, learning_rate_advice

logger = logging.getLogger(__name__)

__all__ = [
    "check_qa_split",
    "check_window_sizes",
    "make_train_features_function",
    "make_eval_features_function",
    "postprocess_qa_predictions",
    "warn_if_constant_answers",
    "constant_loss",
    "QuestionAnsweringTrainer",
    "read_squad_native",
]


# --------------------------------------------------------------------------- checks


def check_qa_split(dataset, split: str, question: str, context: str, answers: str, need_answers: bool) -> int:
    """Columns present, texts are strings, and (when ``need_answers``) every question has at least one
    answer whose ``answer_start`` lies inside its context. Returns how many answers do not match their
    context text at ``answer_start`` (the SQuAD dev set has a few; they are logged, not fatal)."""
    from bitfit_hf.recipe_kit.data import require_columns

    require_columns(dataset, split, [question, context] + ([answers] if need_answers else []), "(SQuAD format)")
    mismatched = 0
    has_answers = answers in dataset.column_names
    questions = dataset[question]
    contexts = dataset[context]
    all_answers = dataset[answers] if has_answers else None
    for row in range(len(dataset)):
        q, c = questions[row], contexts[row]
        if not isinstance(q, str) or not isinstance(c, str):
            raise RecipeError(f"the {split!r} split, row {row}: question and context must be text.")
        if not need_answers or all_answers is None:
            continue
        entry = all_answers[row]
        if not isinstance(entry, dict) or "text" not in entry or "answer_start" not in entry:
            raise RecipeError(
                f"the {split!r} split, row {row}: column {answers!r} must hold {{'text': [...], 'answer_start': [...]}}."
            )
        texts, starts = list(entry["text"]), list(entry["answer_start"])
        if not texts:
            raise RecipeError(
                f"the {split!r} split, row {row}: a question without an answer. squad.py handles SQuAD v1.1, where "
                "every question is answerable (SQuAD v2.0's unanswerable questions are not supported)."
            )
        if len(texts) != len(starts):
            raise RecipeError(f"the {split!r} split, row {row}: {len(texts)} answer texts but {len(starts)} starts.")
        for text, start in zip(texts, starts):
            if not isinstance(start, (int, np.integer)) or not 0 <= start <= len(c) - len(text):
                raise RecipeError(
                    f"the {split!r} split, row {row}: answer_start {start!r} of {text!r} lies outside the context "
                    f"({len(c)} characters)."
                )
            if c[start : start + len(text)] != text:
                mismatched += 1
    return mismatched


def check_window_sizes(tokenizer, max_seq_length: int, doc_stride: int) -> None:
    if max_seq_length is None or max_seq_length <= 0:
        raise RecipeError(f"--max_seq_length must be positive (got {max_seq_length}).")
    if max_seq_length > tokenizer.model_max_length:
        raise RecipeError(
            f"--max_seq_length {max_seq_length} exceeds the model's maximum length ({tokenizer.model_max_length})."
        )
    if not 0 <= doc_stride < max_seq_length // 2:
        raise RecipeError(
            f"--doc_stride {doc_stride} must be at least 0 and less than half of --max_seq_length {max_seq_length} "
            "(it is the overlap between consecutive windows of a long context)."
        )


# --------------------------------------------------------------------------- features


def _encode(tokenizer, questions, contexts, max_seq_length, doc_stride, padding):
    pad_on_right = tokenizer.padding_side == "right"
    # Some SQuAD questions start with long runs of spaces that waste the window: strip them.
    questions = [q.lstrip() for q in questions]
    first, second = (questions, contexts) if pad_on_right else (contexts, questions)
    try:
        return tokenizer(
            first,
            second,
            truncation="only_second" if pad_on_right else "only_first",
            max_length=max_seq_length,
            stride=doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            padding=padding,
        )
    except Exception as err:  # fast tokenizers raise when a question leaves no room for the context
        raise RecipeError(
            f"tokenising question/context windows failed ({err}). A question may be too long for "
            f"--max_seq_length {max_seq_length} with --doc_stride {doc_stride}: raise --max_seq_length or lower "
            "--doc_stride."
        ) from err


def _context_span(sequence_ids: Sequence[Optional[int]], context_index: int) -> Tuple[int, int]:
    start = 0
    while sequence_ids[start] != context_index:
        start += 1
    end = len(sequence_ids) - 1
    while sequence_ids[end] != context_index:
        end -= 1
    return start, end


def make_train_features_function(
    tokenizer, question_column: str, context_column: str, answer_column: str, max_seq_length: int, doc_stride: int, padding
) -> Callable:
    """A batched map function: examples -> windows with ``start_positions`` / ``end_positions``
    (the first answer's tokens, or 0/0 = CLS when the window does not hold the whole answer)."""
    context_index = 1 if tokenizer.padding_side == "right" else 0

    def prepare(examples):
        encoding = _encode(tokenizer, examples[question_column], examples[context_column], max_seq_length, doc_stride, padding)
        sample_map = encoding.pop("overflow_to_sample_mapping")
        offsets_all = encoding.pop("offset_mapping")
        starts, ends = [], []
        for i, offsets in enumerate(offsets_all):
            input_ids = encoding["input_ids"][i]
            cls_index = input_ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in input_ids else 0
            answers = examples[answer_column][sample_map[i]]
            start_char = int(answers["answer_start"][0])
            end_char = start_char + len(answers["text"][0])
            ctx_start, ctx_end = _context_span(encoding.sequence_ids(i), context_index)
            if not (offsets[ctx_start][0] <= start_char and offsets[ctx_end][1] >= end_char):
                starts.append(cls_index)
                ends.append(cls_index)
                continue
            token_start = ctx_start
            while token_start <= ctx_end and offsets[token_start][0] <= start_char:
                token_start += 1
            token_end = ctx_end
            while token_end >= ctx_start and offsets[token_end][1] >= end_char:
                token_end -= 1
            starts.append(token_start - 1)
            ends.append(token_end + 1)
        encoding["start_positions"] = starts
        encoding["end_positions"] = ends
        return encoding

    return prepare


def make_eval_features_function(
    tokenizer, question_column: str, context_column: str, id_column: str, max_seq_length: int, doc_stride: int, padding
) -> Callable:
    """A batched map function: examples -> windows with ``example_id`` and ``offset_mapping`` (``None``
    for every token outside the context, so post-processing can only pick context text)."""
    context_index = 1 if tokenizer.padding_side == "right" else 0

    def prepare(examples):
        encoding = _encode(tokenizer, examples[question_column], examples[context_column], max_seq_length, doc_stride, padding)
        sample_map = encoding.pop("overflow_to_sample_mapping")
        encoding["example_id"] = []
        for i in range(len(encoding["input_ids"])):
            sequence_ids = encoding.sequence_ids(i)
            encoding["example_id"].append(str(examples[id_column][sample_map[i]]))
            encoding["offset_mapping"][i] = [
                list(offset) if sequence_ids[k] == context_index else None
                for k, offset in enumerate(encoding["offset_mapping"][i])
            ]
        return encoding

    return prepare


# --------------------------------------------------------------------------- post-processing


def postprocess_qa_predictions(
    examples,
    features,
    predictions: Tuple[np.ndarray, np.ndarray],
    n_best_size: int = 20,
    max_answer_length: int = 30,
    id_column: str = "id",
    context_column: str = "context",
) -> Tuple[Dict[str, str], Dict[str, List[Dict[str, Any]]]]:
    """Answer text per example id, and each example's n-best list (text, score, probability, offsets).

    ``predictions`` are the start and end logits of every feature (rows may be padded past a
    feature's length, e.g. with -100 by ``Trainer``; those positions have no offset and are skipped).
    An example with no valid span answers ``""``.
    """
    all_start, all_end = predictions[0], predictions[1]
    if len(all_start) != len(features):
        raise ValueError(f"{len(all_start)} predictions for {len(features)} features")
    features_per_example: Dict[str, List[int]] = collections.defaultdict(list)
    for index, example_id in enumerate(features["example_id"]):
        features_per_example[str(example_id)].append(index)
    offsets_column = features["offset_mapping"]

    answers: Dict[str, str] = collections.OrderedDict()
    nbest_all: Dict[str, List[Dict[str, Any]]] = collections.OrderedDict()
    for example in examples:
        example_id = str(example[id_column])
        context = example[context_column]
        candidates: List[Dict[str, Any]] = []
        for feature_index in features_per_example.get(example_id, []):
            start_logits = np.asarray(all_start[feature_index])
            end_logits = np.asarray(all_end[feature_index])
            offsets = offsets_column[feature_index]
            start_indexes = np.argsort(start_logits)[::-1][:n_best_size]
            end_indexes = np.argsort(end_logits)[::-1][:n_best_size]
            for start in start_indexes:
                for end in end_indexes:
                    if start >= len(offsets) or end >= len(offsets):
                        continue
                    if offsets[start] is None or offsets[end] is None:
                        continue
                    if end < start or end - start + 1 > max_answer_length:
                        continue
                    char_start, char_end = offsets[start][0], offsets[end][1]
                    candidates.append(
                        {
                            "text": context[char_start:char_end],
                            "score": float(start_logits[start] + end_logits[end]),
                            "start_logit": float(start_logits[start]),
                            "end_logit": float(end_logits[end]),
                            "offsets": [int(char_start), int(char_end)],
                        }
                    )
        candidates.sort(key=lambda c: c["score"], reverse=True)
        candidates = candidates[:n_best_size]
        if candidates:
            scores = np.array([c["score"] for c in candidates], dtype=np.float64)
            probs = np.exp(scores - scores.max())
            probs /= probs.sum()
            for c, p in zip(candidates, probs):
                c["probability"] = float(p)
        answers[example_id] = candidates[0]["text"] if candidates else ""
        nbest_all[example_id] = candidates
    return answers, nbest_all


def warn_if_constant_answers(answers: Dict[str, str], nbest: Optional[Dict[str, List[Dict[str, Any]]]] = None) -> bool:
    """Warn when every question got the same answer: the same text (every answer empty included: no valid span
    anywhere), or the same span of its context (the same character offsets, from ``nbest``'s best candidate): the
    model answers without reading the question, whatever its score. Returns whether it warned (never for fewer
    than 20 questions)."""
    if len(answers) < CONSTANT_MIN_EXAMPLES:
        return False
    texts = set(answers.values())
    if len(texts) == 1:
        what = f"the same answer, {next(iter(texts))!r}"
    else:
        best = [candidates[0].get("offsets") if candidates and isinstance(candidates[0], dict) else None
                for candidates in (nbest or {}).values()]
        spans = {tuple(offsets) for offsets in best if offsets is not None}
        if len(best) != len(answers) or len(spans) != 1 or None in best:
            return False
        start, end = next(iter(spans))
        what = f"the same span of their contexts (characters {start}-{end})"
    logger.warning(
        "all %d questions got %s: the model learned a constant prediction and answers without reading the question. "
        "Training collapsed or never started: %s.", len(answers), what, learning_rate_advice())
    return True


def constant_loss(features) -> Optional[ConstantLoss]:
    """The training loss of the best prediction that ignores the question and context: the mean of the entropies
    of the answer-start and answer-end positions of the training windows (the QA loss is the mean of the start and
    end cross-entropies). What :class:`CollapseCallback` watches for."""
    if features is None or not {"start_positions", "end_positions"} <= set(features.column_names):
        return None
    start, end = label_entropy(features["start_positions"]), label_entropy(features["end_positions"])
    if start is None or end is None:
        return None
    return ConstantLoss((start + end) / 2, "the entropy of the answer positions of the training windows")


# --------------------------------------------------------------------------- trainer


class QuestionAnsweringTrainer(BitFitTrainer):
    """``BitFitTrainer`` whose ``evaluate`` / ``predict`` turn window logits into answers and score them.

    Extra constructor arguments: ``eval_examples`` (the un-windowed evaluation examples) and
    ``post_process_function(examples, features, (start_logits, end_logits), stage) -> (answers, nbest)``
    and ``compute_answer_metrics(answers, examples) -> dict``.
    """

    def __init__(self, *args, eval_examples=None, post_process_function=None, compute_answer_metrics=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.post_process_function = post_process_function
        self.compute_answer_metrics = compute_answer_metrics
        self.last_answers: Dict[str, Dict[str, Any]] = {}

    def _answer_loop(self, dataset, examples, description: str, metric_key_prefix: str, ignore_keys=None):
        from transformers.trainer_utils import speed_metrics

        dataloader = self.get_eval_dataloader(dataset) if description == "Evaluation" else self.get_test_dataloader(dataset)
        start_time = time.time()
        compute_metrics, self.compute_metrics = self.compute_metrics, None
        try:
            output = self.evaluation_loop(
                dataloader, description=description, prediction_loss_only=False, ignore_keys=ignore_keys,
                metric_key_prefix=metric_key_prefix,
            )
        finally:
            self.compute_metrics = compute_metrics
        metrics = {k: v for k, v in output.metrics.items() if not k.endswith("_loss") or v is not None}
        predictions = output.predictions
        answers, nbest = self.post_process_function(examples, dataset, (predictions[0], predictions[1]), metric_key_prefix)
        self.last_answers[metric_key_prefix] = {"answers": answers, "nbest": nbest}
        if self.is_world_process_zero():
            warn_if_constant_answers(answers, nbest)
        if self.compute_answer_metrics is not None:
            scored = self.compute_answer_metrics(answers, examples)
            metrics.update({f"{metric_key_prefix}_{k}": v for k, v in scored.items()})
        total_batch_size = self.args.eval_batch_size * self.args.world_size
        metrics.update(
            speed_metrics(metric_key_prefix, start_time, num_samples=output.num_samples,
                          num_steps=math.ceil(output.num_samples / total_batch_size))
        )
        metrics[f"{metric_key_prefix}_samples"] = len(examples)
        return metrics

    def evaluate(self, eval_dataset=None, eval_examples=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        examples = self.eval_examples if eval_examples is None else eval_examples
        if dataset is None or examples is None:
            raise ValueError("QuestionAnsweringTrainer.evaluate needs eval features and eval_examples.")
        self._memory_tracker.start()
        metrics = self._answer_loop(dataset, examples, "Evaluation", metric_key_prefix, ignore_keys)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        self._memory_tracker.stop_and_update_metrics(metrics)
        return metrics

    def predict(self, predict_dataset, predict_examples=None, ignore_keys=None, metric_key_prefix: str = "predict"):
        if predict_examples is None:
            raise ValueError("QuestionAnsweringTrainer.predict needs predict_examples (the un-windowed examples).")
        self._memory_tracker.start()
        metrics = self._answer_loop(predict_dataset, predict_examples, "Prediction", metric_key_prefix, ignore_keys)
        self._memory_tracker.stop_and_update_metrics(metrics)
        return metrics


# --------------------------------------------------------------------------- files


def read_squad_native(path: str):
    """A SQuAD v1.1 JSON file (``{"data": [{"paragraphs": [...]}]}``) as one row per question; ``None``
    for other JSON (flat records, JSON Lines: the generic loader reads those)."""
    from bitfit_hf.data import read_squad_json

    if os.path.splitext(path)[1].lower() != ".json":
        return None
    with open(path, encoding="utf-8-sig") as handle:
        head = handle.read(64).lstrip()
        if not head.startswith("{"):
            return None  # JSON Lines or a list of records
        handle.seek(0)
        try:
            doc = json.load(handle)
        except json.JSONDecodeError:
            return None  # JSON Lines whose first record is an object: the generic loader reads it
    if not (isinstance(doc, dict) and isinstance(doc.get("data"), list) and doc["data"]):
        return None
    records = doc["data"]
    if all(isinstance(r, dict) and "question" in r and "context" in r for r in records[:5]):
        import datasets  # flat records under "data" (the layout of transformers' QA examples)

        return datasets.Dataset.from_list(records)
    if not all(isinstance(a, dict) and "paragraphs" in a for a in records[:5]):
        return None
    try:
        return read_squad_json(path, as_dataset=True)
    except ValueError as err:
        raise RecipeError(f"cannot read {path} as SQuAD JSON: {err}") from None


def write_json(path: str, data: Any) -> None:
    from bitfit_hf.utils.io import write_text_atomic

    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
