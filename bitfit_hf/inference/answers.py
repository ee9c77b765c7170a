"""Logits -> answers, per head type. Every front end (``predict``, ``serve``, the pipelines) calls these.

* classification: the score function transformers' text-classification pipeline picks (``score_function``):
  none for regression, sigmoid for multi-label adapters (``problem_type`` ``multi_label_classification``, as
  the adapter records it) and single-logit heads, softmax otherwise; labels best first.
* tagging: each word gets the label of its first sub-token, scored by its softmax probability (the
  token-classification pipeline's scores at those tokens; tests/inference checks they are equal). A word past
  the length limit has no tag (``word/?``) rather than disappearing.
* extractive QA: transformers 4's question-answering pipeline's decoding, over every window of the context:
  start and end probabilities per window (softmax over the window's context tokens and its CLS), the best
  span of at most ``max_answer_len`` tokens, windows compared by those probabilities; with
  ``handle_impossible_answer`` the empty answer competes with its smallest CLS score over the windows.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from bitfit_hf.adapters.task_types import QUESTION_ANS, SEQ_CLS

MAX_ANSWER_LEN = 30  # tokens; the squad recipe's --max_answer_length default

NONE, SIGMOID, SOFTMAX = "none", "sigmoid", "softmax"


def score_function(problem_type: Optional[str], num_labels: int) -> str:
    """What turns a classifier's logits into scores: the rule of transformers' text-classification pipeline."""
    if problem_type == "regression":
        return NONE
    if problem_type == "multi_label_classification" or num_labels == 1:
        return SIGMOID
    return SOFTMAX


def classification_answer(logits: torch.Tensor, id2label: Dict[int, str], problem_type: Optional[str],
                          raw_scores: bool = False, top_k: Optional[int] = None) -> List[Dict[str, Any]]:
    """``[{"label", "score"}]`` best first (``top_k`` of them); ``raw_scores``: the logits themselves."""
    logits = logits.float().reshape(-1)
    function = NONE if raw_scores else score_function(problem_type, logits.numel())
    scores = {NONE: lambda x: x, SIGMOID: torch.sigmoid, SOFTMAX: lambda x: torch.softmax(x, -1)}[function](logits)
    order = torch.argsort(scores, descending=True, stable=True).tolist()
    if top_k is not None:
        order = order[:top_k]
    return [{"label": id2label.get(i, f"LABEL_{i}"), "score": float(scores[i])} for i in order]


def tagging_answer(logits: torch.Tensor, meta: Dict[str, Any], id2label: Dict[int, str]) -> Dict[str, Any]:
    """``{"tagged": "the/DT cat/NN", "spans": [{"word", "tag", "score", "start", "end"}], "untagged": [i, ...]}``;
    words the model did not read (cut at the length limit) are ``word/?`` and listed in ``untagged``."""
    words, word_ids = meta["words"], meta["word_ids"]
    probs = torch.softmax(logits.float(), dim=-1)
    best = probs.max(dim=-1)
    first: Dict[int, int] = {}
    for position, word in enumerate(word_ids):
        if word is not None and word not in first and position < probs.shape[0]:
            first[word] = position
    spans, shown = [], []
    for w, (text, start, end) in enumerate(words):
        if w not in first:
            shown.append(f"{text}/?")
            continue
        label = int(best.indices[first[w]])
        tag = id2label.get(label, f"LABEL_{label}")
        spans.append({"word": text, "tag": tag, "score": float(best.values[first[w]]), "start": start, "end": end})
        shown.append(f"{text}/{tag}")
    return {"tagged": " ".join(shown), "spans": spans, "untagged": [w for w in range(len(words)) if w not in first]}


def _window_spans(start_logits: torch.Tensor, end_logits: torch.Tensor, meta: Dict[str, Any], max_answer_len: int,
                  top_k: int) -> Tuple[List[Tuple[float, int, int]], Optional[float]]:
    """One window: its ``top_k`` spans ``(probability, start token, end token)`` and its null score."""
    sequence_ids = meta["sequence_ids"]
    n = min(len(sequence_ids), start_logits.shape[0])
    wanted = torch.tensor([sequence_ids[i] == 1 for i in range(n)], dtype=torch.bool)
    cls = meta.get("cls")
    kept = wanted.clone()
    if cls is not None and cls < n:
        kept[cls] = True  # the CLS token stays in the softmax: models score "no answer" there
    start = torch.softmax(start_logits[:n].float().masked_fill(~kept, -10000.0), -1)
    end = torch.softmax(end_logits[:n].float().masked_fill(~kept, -10000.0), -1)
    null = float(start[cls] * end[cls]) if cls is not None and cls < n else None
    start, end = start.masked_fill(~wanted, 0.0), end.masked_fill(~wanted, 0.0)
    pairs = (start.double()[:, None] * end.double()[None, :]).triu().tril(max_answer_len - 1)  # no underflow
    flat = pairs.reshape(-1)
    k = min(top_k, int((flat > 0).sum()))
    if k == 0:
        return [], null
    values, indices = torch.topk(flat, k)
    return [(float(v), int(i) // n, int(i) % n) for v, i in zip(values, indices)], null


def qa_answer(windows: Sequence[Tuple[torch.Tensor, torch.Tensor, Dict[str, Any]]], max_answer_len: int = MAX_ANSWER_LEN,
              handle_impossible_answer: bool = False, top_k: int = 1):
    """``{"answer", "score", "start", "end"}`` (character offsets into the context) from every window of one
    question; a list of ``top_k`` answers when ``top_k`` > 1."""
    answers: List[Dict[str, Any]] = []
    null_score: Optional[float] = None
    for start_logits, end_logits, meta in windows:
        spans, null = _window_spans(start_logits, end_logits, meta, max_answer_len, top_k)
        if null is not None:
            null_score = null if null_score is None else min(null_score, null)
        offsets, context = meta["offsets"], meta["context"]
        for score, s, e in spans:
            begin, finish = int(offsets[s][0]), int(offsets[e][1])
            answers.append({"answer": context[begin:finish], "score": score, "start": begin, "end": finish})
    if handle_impossible_answer:
        answers.append({"answer": "", "score": null_score if null_score is not None else 0.0, "start": 0, "end": 0})
    answers.sort(key=lambda a: -a["score"])
    unique: List[Dict[str, Any]] = []
    for a in answers:  # a span two windows share is one answer (its best score)
        if not any((u["start"], u["end"]) == (a["start"], a["end"]) for u in unique):
            unique.append(a)
    if not unique:
        unique = [{"answer": "", "score": 0.0, "start": 0, "end": 0}]
    return unique[0] if top_k == 1 else unique[:top_k]


def answer(task: str, outputs: Sequence[Any], features: Sequence[Any], n_items: int, id2label: Dict[int, str],
           problem_type: Optional[str], options: Optional[Dict[str, Any]] = None) -> List[Any]:
    """Every item's answer from its features' outputs (a row's logits; QA: ``(start_logits, end_logits)``).
    ``options``: ``raw_scores``, ``top_k`` (classification; QA answers), ``max_answer_len``,
    ``handle_impossible_answer`` (QA)."""
    options = options or {}
    if task == QUESTION_ANS:
        per_item: List[List] = [[] for _ in range(n_items)]
        for feature, out in zip(features, outputs):
            per_item[feature.item].append((out[0], out[1], feature.meta))
        return [qa_answer(w, options.get("max_answer_len") or MAX_ANSWER_LEN,
                          bool(options.get("handle_impossible_answer")), options.get("top_k") or 1) for w in per_item]
    found: List[Any] = [None] * n_items
    for feature, out in zip(features, outputs):
        if task == SEQ_CLS:
            found[feature.item] = classification_answer(out, id2label, problem_type, bool(options.get("raw_scores")),
                                                        options.get("top_k"))
        else:
            found[feature.item] = tagging_answer(out, feature.meta, id2label)
    return found
