"""Per task type: what ``inputs`` a request may hold, how they are tokenized, and what comes back.

``inputs`` follows text-embeddings-inference's ``/predict``: one input or a batch (a list) of them.

* classification: a text, or a pair ``[text, text]``. As in TEI a list of exactly two texts is ONE pair;
  a batch of two single texts is written ``[["a"], ["b"]]``. Answer per input: ``[{"label", "score"}]``,
  best first (softmax; sigmoid for multi-label adapters; the value for regression; logits with
  ``"raw_scores": true``).
* tagging (token classification): a text, or a list of texts (no pairs). The text is split on white
  space; each word gets the tag of its first sub-token. Answer per input:
  ``{"tagged": "the/DT cat/NN", "spans": [{"word", "tag", "score", "start", "end"}]}``.
* question answering: ``[question, context]`` or ``{"question", "context"}``, or a list of those.
  Answer per input: ``{"answer", "score", "start", "end"}`` (character offsets into the context).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

MAX_ANSWER_TOKENS = 30


class InputError(Exception):
    """A request the server answers with an error status and a one-line reason."""

    def __init__(self, status: int, message: str, error_type: str = "validation", **extra):
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.extra = extra


@dataclass
class Encoded:
    """One input, tokenized: the model's inputs (unpadded lists) and what post-processing needs."""

    features: Dict[str, List[int]]
    meta: Any = None

    @property
    def length(self) -> int:
        return len(self.features["input_ids"])


@dataclass
class Parsed:
    items: List[Any]
    single: bool  # the request held one input (the answer is not wrapped in a list)
    options: Dict[str, Any] = field(default_factory=dict)


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_texts(value: Any, n: int) -> bool:
    return isinstance(value, list) and len(value) == n and all(isinstance(v, str) for v in value)


def parse_inputs(task: str, inputs: Any) -> Parsed:
    """``inputs`` of a request for an adapter of ``task`` -> the items, and whether it was one input."""
    if inputs is None:
        raise InputError(422, "the request has no 'inputs'.")
    if task == "SEQ_CLS":
        if isinstance(inputs, str):
            return Parsed([(inputs, None)], True)
        if _is_texts(inputs, 2):  # TEI: two texts are one pair
            return Parsed([(inputs[0], inputs[1])], True)
        if isinstance(inputs, list) and inputs:
            items = []
            for i, value in enumerate(inputs):
                if isinstance(value, str):
                    items.append((value, None))
                elif _is_texts(value, 1) or _is_texts(value, 2):
                    items.append((value[0], value[1] if len(value) == 2 else None))
                else:
                    raise InputError(422, f"inputs[{i}] must be a text or a pair [text, text], not {_describe(value)}.")
            return Parsed(items, False)
        raise InputError(422, "'inputs' must be a text, a pair [text, text], or a non-empty list of them; "
                              f"got {_describe(inputs)}.")
    if task == "TOKEN_CLS":
        if isinstance(inputs, str):
            return Parsed([inputs], True)
        if isinstance(inputs, list) and inputs and all(isinstance(v, str) for v in inputs):
            return Parsed(list(inputs), False)
        raise InputError(422, f"a tagging adapter takes a text or a non-empty list of texts; got {_describe(inputs)}.")
    # QUESTION_ANS
    def qa_item(value: Any, where: str) -> Tuple[str, str]:
        if _is_texts(value, 2):
            return value[0], value[1]
        if isinstance(value, dict) and isinstance(value.get("question"), str) and isinstance(value.get("context"), str):
            return value["question"], value["context"]
        raise InputError(422, f"{where} must be [question, context] or {{\"question\", \"context\"}}, not {_describe(value)}.")

    if _is_texts(inputs, 2) or isinstance(inputs, dict):
        return Parsed([qa_item(inputs, "'inputs'")], True)
    if isinstance(inputs, list) and inputs:
        return Parsed([qa_item(v, f"inputs[{i}]") for i, v in enumerate(inputs)], False)
    raise InputError(422, "a question-answering adapter takes [question, context] (or a list of them); "
                          f"got {_describe(inputs)}.")


_WORDS = re.compile(r"\S+")


def encode(tokenizer, task: str, items: List[Any], max_length: int, truncate: bool) -> List[Encoded]:
    """Tokenize every item; over-long inputs are cut (``truncate``) or refused with 422."""
    out: List[Encoded] = []
    for i, item in enumerate(items):
        if task == "SEQ_CLS":
            text, pair = item
            enc = tokenizer(text, pair, truncation=True if truncate else False, max_length=max_length if truncate else None)
            meta = None
        elif task == "TOKEN_CLS":
            words = [(m.group(), m.start(), m.end()) for m in _WORDS.finditer(item)]
            if not words:
                raise InputError(422, f"inputs[{i}] has no words to tag.")
            enc = tokenizer([w for w, _, _ in words], is_split_into_words=True, truncation=True if truncate else False,
                            max_length=max_length if truncate else None)
            meta = (words, enc.word_ids())
        else:
            question, context = item
            enc = tokenizer(question, context, truncation="only_second" if truncate else False,
                            max_length=max_length if truncate else None, return_offsets_mapping=True)
            meta = (context, enc.pop("offset_mapping"), enc.sequence_ids())
            if 1 not in meta[2]:
                raise InputError(422, f"inputs[{i}]: the question leaves no room for the context within {max_length} tokens.")
        features = {k: list(v) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        if len(features["input_ids"]) > max_length:
            raise InputError(422, f"inputs[{i}] is {len(features['input_ids'])} tokens long; this server takes at most "
                                  f"{max_length} per input. Send \"truncate\": true to cut it.")
        out.append(Encoded(features, meta))
    return out


def collate(encoded: List[Encoded], pad_id: int, left: bool, device) -> Dict[str, torch.Tensor]:
    """Pad a chunk of inputs to its longest one."""
    width = max(e.length for e in encoded)
    batch: Dict[str, torch.Tensor] = {}
    for key in encoded[0].features:
        fill = pad_id if key == "input_ids" else 0
        rows = []
        for e in encoded:
            values = e.features[key]
            padding = [fill] * (width - len(values))
            rows.append(padding + values if left else values + padding)
        batch[key] = torch.tensor(rows, dtype=torch.long, device=device)
    return batch


# --------------------------------------------------------------------------- answers


def classification_answer(logits: torch.Tensor, id2label: Dict[int, str], problem_type: Optional[str],
                          raw_scores: bool, top_k: Optional[int]) -> List[Dict[str, Any]]:
    logits = logits.float()
    if raw_scores or problem_type == "regression" or logits.numel() == 1 and problem_type != "multi_label_classification":
        scores = logits
    elif problem_type == "multi_label_classification":
        scores = torch.sigmoid(logits)
    else:
        scores = torch.softmax(logits, dim=-1)
    order = torch.argsort(scores, descending=True).tolist()
    if top_k is not None:
        order = order[:top_k]
    return [{"label": id2label.get(i, f"LABEL_{i}"), "score": float(scores[i])} for i in order]


def tagging_answer(logits: torch.Tensor, meta, id2label: Dict[int, str]) -> Dict[str, Any]:
    words, word_ids = meta
    probs = torch.softmax(logits.float(), dim=-1)
    best = probs.max(dim=-1)
    spans, seen = [], set()
    for position, word in enumerate(word_ids):
        if word is None or word in seen or position >= probs.shape[0]:
            continue
        seen.add(word)
        label = int(best.indices[position])
        text, start, end = words[word]
        spans.append({"word": text, "tag": id2label.get(label, f"LABEL_{label}"),
                      "score": float(best.values[position]), "start": start, "end": end})
    return {"tagged": " ".join(f"{s['word']}/{s['tag']}" for s in spans), "spans": spans}


def qa_answer(start_logits: torch.Tensor, end_logits: torch.Tensor, meta) -> Dict[str, Any]:
    context, offsets, sequence_ids = meta
    n = min(len(sequence_ids), start_logits.shape[0])
    in_context = torch.tensor([sequence_ids[i] == 1 for i in range(n)])
    start = start_logits[:n].float().masked_fill(~in_context, float("-inf"))
    end = end_logits[:n].float().masked_fill(~in_context, float("-inf"))
    p_start, p_end = torch.softmax(start, -1), torch.softmax(end, -1)
    pairs = p_start[:, None] * p_end[None, :]
    band = torch.ones(n, n, dtype=torch.bool).triu().tril(MAX_ANSWER_TOKENS - 1)
    pairs = pairs.masked_fill(~band, 0.0)
    flat = int(torch.argmax(pairs))
    s, e = divmod(flat, n)
    begin, finish = int(offsets[s][0]), int(offsets[e][1])
    return {"answer": context[begin:finish], "score": float(pairs[s, e]), "start": begin, "end": finish}
