"""A task's inputs: the layouts a request may use, the checks the adapter allows, and tokenizing.

Layouts are text-embeddings-inference's (``/predict``), the same for every task so one client talks to every
adapter alike:

* one input: ``"text"``; a pair ``["a", "b"]`` (classification; QA: ``[question, context]`` or
  ``{"question", "context"}``);
* a batch: ``[["a"], ["a", "b"], ...]`` (each entry a one-text or two-text list; QA entries may be dicts);
* a plain list of texts ``["a", "b", "c"]`` is a batch of single texts wherever that is unambiguous: always
  for a tagger (it takes no pairs), and for a classifier unless it holds exactly two texts, which TEI reads as
  one pair.

Items are ``(text, pair_or_None)`` (classification), ``text`` (tagging) or ``(question, context)`` (QA).
Classification and tagging read one feature per item (cut at the length limit, or refused); QA reads the
whole context in overlapping windows (``doc_stride`` tokens shared by neighbours), as transformers 4's
question-answering pipeline did, so an answer anywhere in a context of any length can be found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from bitfit_hf.adapters.task_types import ANSWERED, QUESTION_ANS, SEQ_CLS, TOKEN_CLS
from bitfit_hf.utils.errors import UserError

DOC_STRIDE = 128  # tokens two neighbouring QA windows share (transformers' QA pipeline and run_qa default)
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

_WORDS = re.compile(r"\S+")
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "longformer", "mpnet", "xlm-roberta-xl")


class InputRefused(UserError, ValueError):
    """Inputs an adapter cannot take as given; ``index`` is the item's place in the request (``None``: all)."""

    def __init__(self, message: str, index: Optional[int] = None):
        super().__init__(message)
        self.index = index


@dataclass
class Parsed:
    """A request's items, and whether it held one input (its answer is then not wrapped in a list)."""

    items: List[Any]
    single: bool


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _texts(value: Any, *sizes: int) -> bool:
    return isinstance(value, (list, tuple)) and len(value) in sizes and all(isinstance(v, str) for v in value)


def parse_inputs(task: str, inputs: Any) -> Parsed:
    """``inputs`` in one of TEI's layouts -> the items of ``task``; :class:`InputRefused` names what is wrong."""
    if inputs is None:
        raise InputRefused("the request has no 'inputs'.")
    if task == SEQ_CLS:
        if isinstance(inputs, str):
            return Parsed([(inputs, None)], True)
        if _texts(inputs, 2):  # TEI: two texts are one pair
            return Parsed([(inputs[0], inputs[1])], True)
        if isinstance(inputs, list) and inputs:
            items = []
            for i, value in enumerate(inputs):
                if isinstance(value, str):
                    items.append((value, None))
                elif _texts(value, 1, 2):
                    items.append((value[0], value[1] if len(value) == 2 else None))
                else:
                    raise InputRefused(f"inputs[{i}] must be a text, [text] or a pair [text, text], not {shown(value)}.", i)
            return Parsed(items, False)
        raise InputRefused("'inputs' must be a text, a pair [text, text], or a non-empty list of texts or of "
                           f"[text] / [text, text]; got {shown(inputs)}.")
    if task == TOKEN_CLS:
        if isinstance(inputs, str):
            return Parsed([inputs], True)
        if isinstance(inputs, list) and inputs:
            items = []
            for i, value in enumerate(inputs):
                if isinstance(value, str) or _texts(value, 1):
                    items.append(value if isinstance(value, str) else value[0])
                elif _texts(value, 2):
                    raise InputRefused(f"a tagging adapter tags one sentence per input; inputs[{i}] is a pair "
                                       f"({shown(value)}). Send each sentence as an input of its own.", i)
                else:
                    raise InputRefused(f"inputs[{i}] must be a text or [text], not {shown(value)}.", i)
            return Parsed(items, False)
        raise InputRefused("a tagging adapter takes a text, or a non-empty list of texts or of [text]; "
                           f"got {shown(inputs)}.")
    if task != QUESTION_ANS:
        raise InputRefused(f"no inputs are defined for {task or 'untyped'} adapters; tasks: {', '.join(ANSWERED)}.")

    def qa_item(value: Any, where: str, index: Optional[int]) -> Tuple[str, str]:
        if _texts(value, 2):
            return value[0], value[1]
        if isinstance(value, dict) and isinstance(value.get("question"), str) and isinstance(value.get("context"), str):
            return value["question"], value["context"]
        if _texts(value, 1):
            raise InputRefused(f"{where} has a question but no context: send [question, context].", index)
        raise InputRefused(f"{where} must be [question, context] or {{\"question\", \"context\"}}, not {shown(value)}.",
                           index)

    if _texts(inputs, 2) or isinstance(inputs, dict):
        return Parsed([qa_item(inputs, "'inputs'", None)], True)
    if isinstance(inputs, list) and inputs:
        return Parsed([qa_item(v, f"inputs[{i}]", i) for i, v in enumerate(inputs)], False)
    raise InputRefused("a question-answering adapter takes [question, context] or {\"question\", \"context\"}, or "
                       f"a non-empty list of them; got {shown(inputs)}.")


def text_columns(config) -> Optional[List[str]]:
    """The text columns an adapter records it was trained on (the glue recipe's do), else ``None``."""
    columns = (getattr(config, "metadata", None) or {}).get("text_columns")
    return [c for c in columns if c] if isinstance(columns, list) else None


def check_items(config, items: Sequence[Any], where: Callable[[int], str] = lambda i: f"inputs[{i}]",
                pair_layout: str = "[first, second]") -> None:
    """Refuse items the adapter cannot take as given instead of changing them: a pair for a classifier trained
    on single texts, a single text for one trained on pairs (when it records its text columns), a QA question
    without a context. ``where(i)`` names item ``i`` in the caller's terms, ``pair_layout`` how to write a pair."""
    task = config.task_type
    columns = text_columns(config)
    for i, item in enumerate(items):
        if task == SEQ_CLS and columns and len(columns) == 1 and item[1] is not None:
            raise InputRefused(f"this adapter classifies single texts (trained on the column {columns[0]!r}); "
                               f"{where(i)} is a pair ({shown(list(item))}). Give one text per input.", i)
        if task == SEQ_CLS and columns and len(columns) == 2 and item[1] is None:
            raise InputRefused(f"this adapter classifies pairs ({columns[0]}, {columns[1]}); {where(i)} is a single "
                               f"text ({shown(item[0])}). Write each input as {pair_layout}.", i)
        if task == QUESTION_ANS and not item[1]:
            raise InputRefused(f"a QA adapter needs a question and a context; {where(i)} has no context.", i)


# --------------------------------------------------------------------------- the length limit


@dataclass
class Limit:
    """The most tokens a model reads per feature, and which bound set it (for messages)."""

    tokens: int
    why: str


def length_limit(asked: Optional[int], tokenizer, model_config) -> Limit:
    """``asked`` (``None``: no wish), lowered to the tokenizer's limit and the model's position embeddings
    (RoBERTa-style models count positions from after the padding index)."""
    found = [(asked, f"--max-length {asked}")] if asked else []
    tok = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok, int) and 0 < tok < 1_000_000:
        found.append((tok, f"the tokenizer's limit, {tok}"))
    positions = getattr(model_config, "max_position_embeddings", None) or getattr(model_config, "n_positions", None)
    if isinstance(positions, int) and positions > 0:
        if getattr(model_config, "model_type", "") in _OFFSET_POSITIONS:
            positions -= int(getattr(model_config, "pad_token_id", 1) or 1) + 1
        found.append((positions, f"the model's {positions} positions"))
    if not found:
        return Limit(512, "the default, 512")
    tokens, why = min(found, key=lambda pair: pair[0])
    return Limit(tokens, why)


# --------------------------------------------------------------------------- tokenizing


@dataclass
class Feature:
    """One row of a batch: the model inputs (unpadded lists), the item it reads and what answering needs.

    ``meta``: classification ``{"tokens": full length}``; tagging ``{"words": [(word, start, end)],
    "word_ids": [...]}``; QA ``{"context", "offsets", "sequence_ids", "cls"}`` of one window."""

    features: Dict[str, List[int]]
    item: int
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.features["input_ids"])


def _model_inputs(encoding) -> Dict[str, List[int]]:
    return {k: list(encoding[k]) for k in MODEL_INPUTS if k in encoding}


def encode(tokenizer, task: str, items: Sequence[Any], limit: int, truncate: bool = True,
           doc_stride: int = DOC_STRIDE) -> List[Feature]:
    """Features of every item, in item order (several per QA item). An input past ``limit`` is cut
    (``truncate``; the meta keeps its full length) or refused; QA contexts are never cut but windowed."""
    out: List[Feature] = []
    for i, item in enumerate(items):
        if task == SEQ_CLS:
            feature = _classification_feature(tokenizer, item, i, limit, truncate)
        elif task == TOKEN_CLS:
            words = [(m.group(), m.start(), m.end()) for m in _WORDS.finditer(item)]
            if not words:
                raise InputRefused(f"inputs[{i}] has no words to tag.", i)
            enc = tokenizer([w for w, _, _ in words], is_split_into_words=True, truncation=bool(truncate),
                            max_length=limit if truncate else None)
            feature = Feature(_model_inputs(enc), i, {"words": words, "word_ids": enc.word_ids()})
        else:
            out.extend(qa_windows(tokenizer, item[0], item[1], limit, doc_stride, index=i))
            continue
        if feature.length > limit:
            raise InputRefused(f"inputs[{i}] is {feature.length} tokens long; at most {limit} are read per input. "
                               "Send \"truncate\": true to cut it.", i)
        out.append(feature)
    return out


def _classification_feature(tokenizer, item, index: int, limit: int, truncate: bool) -> Feature:
    """One tokenizer call per input: its uncut encoding is the feature, cut here when it is past ``limit``
    (a second, cutting call only for a pair or a slow tokenizer). The meta keeps the uncut length."""
    text, pair = item
    full = _uncut(tokenizer, text, pair)
    tokens = len(full["input_ids"])
    if tokens <= limit or not truncate:
        return Feature(_model_inputs(full), index, {"tokens": tokens})
    cut = _cut_single(full, limit, tokenizer.truncation_side) if pair is None else None
    if cut is None:
        cut = _model_inputs(tokenizer(text, pair, truncation=True, max_length=limit))
    return Feature(cut, index, {"tokens": tokens})


def _cut_single(encoding, limit: int, side: str) -> Optional[Dict[str, List[int]]]:
    """A fast tokenizer's uncut encoding of one text cut to ``limit`` tokens as the tokenizer cuts it: the
    special tokens kept, the text's tokens kept from the start (``side`` "right") or the end ("left").
    ``None`` without a fast tokenizer's sequence ids."""
    if not getattr(encoding, "encodings", None):
        return None
    sequence_ids = encoding.sequence_ids()
    text = [p for p, s in enumerate(sequence_ids) if s == 0]
    room = limit - (len(sequence_ids) - len(text))
    if room < 0:
        return None
    kept = set(text[:room] if side == "right" else text[len(text) - room:])
    keep = [p for p, s in enumerate(sequence_ids) if s is None or p in kept]
    return {k: [v[p] for p in keep] for k, v in _model_inputs(encoding).items()}


def _uncut(tokenizer, text, pair=None):
    """An input's encoding uncut, without transformers' 'longer than the maximum' warning (it is handled;
    ``verbose=False`` rather than a global log level, which concurrent tokenizing threads would race on)."""
    return tokenizer(text, pair, truncation=False, verbose=False)


def qa_windows(tokenizer, question: str, context: str, limit: int, doc_stride: int = DOC_STRIDE,
               index: int = 0) -> List[Feature]:
    """The question with every window of the context that fits ``limit`` tokens, neighbours sharing
    ``doc_stride`` tokens (lowered to half the room the question leaves, so windows always advance)."""
    if not getattr(tokenizer, "is_fast", False):
        raise InputRefused("question answering needs the character offsets of a fast tokenizer (a tokenizer.json).")
    question_tokens = len(tokenizer(question, add_special_tokens=False)["input_ids"])
    room = limit - question_tokens - tokenizer.num_special_tokens_to_add(pair=True)
    if room < 2:
        raise InputRefused(f"inputs[{index}]: the question is {question_tokens} tokens long and leaves no room for "
                           f"the context within {limit} tokens.", index)
    stride = max(0, min(doc_stride, room // 2))
    enc = tokenizer(question, context, truncation="only_second", max_length=limit, stride=stride,
                    return_overflowing_tokens=True, return_offsets_mapping=True)
    windows = []
    for w in range(len(enc["input_ids"])):
        sequence_ids = enc.sequence_ids(w)
        ids = enc["input_ids"][w]
        cls = next((p for p, t in enumerate(ids) if t == tokenizer.cls_token_id), None) \
            if tokenizer.cls_token_id is not None else None
        features = {k: list(enc[k][w]) for k in MODEL_INPUTS if k in enc}
        windows.append(Feature(features, index, {"context": context, "offsets": [tuple(o) for o in enc["offset_mapping"][w]],
                                                 "sequence_ids": sequence_ids, "cls": cls}))
    if not any(1 in w.meta["sequence_ids"] for w in windows):
        raise InputRefused(f"inputs[{index}]: no room for the context within {limit} tokens.", index)
    return windows
