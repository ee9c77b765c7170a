"""``pipeline("question-answering", model=..., tokenizer=...)`` again: transformers 5 removed its extractive
QA pipeline (pointing to text generation), while encoder QA models (and this project's QA adapters) still
need one. This one reads the context in the same overlapping windows and decodes the same answers as
``bitfit-hf predict`` and ``bitfit-hf serve`` (:mod:`bitfit_hf.inference`); its arguments are transformers
4's: ``doc_stride``, ``max_answer_len``, ``max_seq_len``, ``handle_impossible_answer``, ``top_k``.

Registered through transformers' own registry (``PIPELINE_REGISTRY.register_pipeline``) when
``transformers.pipelines`` is imported after ``import bitfit_hf``; transformers' entry listing the task as
removed is dropped, so the registry's answer is the one used.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
from transformers import AutoModelForQuestionAnswering
from transformers.pipelines.base import ChunkPipeline

from bitfit_hf.inference.answers import MAX_ANSWER_LEN, qa_answer
from bitfit_hf.inference.inputs import DOC_STRIDE, InputRefused, length_limit, qa_windows

TASK = "question-answering"


def _examples(args, kwargs) -> Any:
    """transformers 4's layouts: ``(question=, context=)`` (texts or lists), a dict, or a list of dicts."""
    if args:
        if len(args) == 2 and all(isinstance(a, str) for a in args):
            return {"question": args[0], "context": args[1]}
        return args[0]
    question, context = kwargs.pop("question", None), kwargs.pop("context", None)
    if question is None or context is None:
        raise InputRefused("give question= and context= (texts, or lists of the same length), or "
                           "{\"question\", \"context\"} dicts.")
    if isinstance(question, list) and isinstance(context, list):
        if len(question) != len(context):
            raise InputRefused(f"{len(question)} questions for {len(context)} contexts.")
        return [{"question": q, "context": c} for q, c in zip(question, context)]
    if isinstance(question, list):
        return [{"question": q, "context": context} for q in question]
    return {"question": question, "context": context}


class ExtractiveQuestionAnsweringPipeline(ChunkPipeline):
    """Extractive QA over a context of any length: one forward pass per window, answers decoded over all."""

    def _sanitize_parameters(self, doc_stride=None, max_answer_len=None, max_seq_len=None,
                             handle_impossible_answer=None, top_k=None, **unknown):
        if unknown:
            raise InputRefused(f"unknown argument(s) {', '.join(sorted(unknown))}; the question-answering pipeline "
                               "takes doc_stride, max_answer_len, max_seq_len, handle_impossible_answer, top_k.")
        pre: Dict[str, Any] = {}
        post: Dict[str, Any] = {}
        if doc_stride is not None:
            pre["doc_stride"] = doc_stride
        if max_seq_len is not None:
            pre["max_seq_len"] = max_seq_len
        if max_answer_len is not None:
            if max_answer_len < 1:
                raise InputRefused(f"max_answer_len must be at least 1 (got {max_answer_len}).")
            post["max_answer_len"] = max_answer_len
        if handle_impossible_answer is not None:
            post["handle_impossible_answer"] = handle_impossible_answer
        if top_k is not None:
            if top_k < 1:
                raise InputRefused(f"top_k must be at least 1 (got {top_k}).")
            post["top_k"] = top_k
        return pre, {}, post

    def __call__(self, *args, **kwargs):
        examples = _examples(args, kwargs)
        return super().__call__(examples, **kwargs)

    def preprocess(self, example, doc_stride: int = DOC_STRIDE, max_seq_len=None):
        if isinstance(example, (list, tuple)) and len(example) == 2 and all(isinstance(x, str) for x in example):
            example = {"question": example[0], "context": example[1]}
        if not isinstance(example, dict) or not isinstance(example.get("question"), str) \
                or not isinstance(example.get("context"), str):
            raise InputRefused(f"each example is {{\"question\", \"context\"}} (texts), not {example!r:.60}.")
        limit = length_limit(max_seq_len, self.tokenizer, self.model.config)
        windows = qa_windows(self.tokenizer, example["question"], example["context"], limit.tokens, doc_stride)
        for i, window in enumerate(windows):
            inputs = {k: torch.tensor([v]) for k, v in window.features.items()}
            yield {**inputs, "meta": window.meta, "is_last": i == len(windows) - 1}

    def _forward(self, inputs):
        meta, is_last = inputs.pop("meta"), inputs.pop("is_last")
        out = self.model(**inputs)
        return {"start_logits": out.start_logits, "end_logits": out.end_logits, "meta": meta, "is_last": is_last}

    def postprocess(self, outputs: List[Dict[str, Any]], max_answer_len: int = MAX_ANSWER_LEN,
                    handle_impossible_answer: bool = False, top_k: int = 1):
        windows = [(o["start_logits"][0], o["end_logits"][0], o["meta"]) for o in outputs]
        return qa_answer(windows, max_answer_len, handle_impossible_answer, top_k)


def register() -> None:
    """``pipeline("question-answering", ...)`` builds :class:`ExtractiveQuestionAnsweringPipeline`."""
    from transformers import pipelines

    getattr(pipelines, "REMOVED_TASKS", {}).pop(TASK, None)  # transformers 5 lists the task as removed
    PIPELINE_REGISTRY = pipelines.PIPELINE_REGISTRY
    current = PIPELINE_REGISTRY.supported_tasks.get(TASK, {})
    if current.get("impl") is not ExtractiveQuestionAnsweringPipeline:
        PIPELINE_REGISTRY.register_pipeline(TASK, pipeline_class=ExtractiveQuestionAnsweringPipeline,
                                            pt_model=AutoModelForQuestionAnswering, type="text")
