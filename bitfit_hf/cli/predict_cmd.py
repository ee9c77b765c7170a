"""``bitfit-hf predict ADAPTER TEXT...``: the stock base plus the adapter, on a few texts.

Sequence classification prints the top labels with their probabilities (regression: the value);
sentence pairs are written ``first ||| second`` (or tab-separated in ``--file``); token
classification prints ``word/TAG`` for every word; extractive QA takes ``question ||| context``.
"""

from __future__ import annotations

import argparse
import os
from typing import List, Optional, Tuple

from bitfit_hf.cli.adapter_source import load_adapter_files, load_tokenizer
from bitfit_hf.cli.errors import CliError

PAIR_SEPARATOR = "|||"
TASKS = ("SEQ_CLS", "TOKEN_CLS", "QUESTION_ANS")


def register(verbs) -> None:
    parser = verbs.add_parser("predict", help="run an adapter on texts (labels with scores, tags, or answers)",
                              description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("adapter", help="adapter folder, or Hub id")
    parser.add_argument("texts", nargs="*", metavar="TEXT", help=f"inputs; a pair as 'first {PAIR_SEPARATOR} second'")
    parser.add_argument("--file", help="read inputs from this file, one per line (a tab separates a pair)")
    parser.add_argument("--top-k", type=int, default=1, help="labels to print per input (classification)")
    parser.add_argument("--revision", help="branch, tag or commit of a Hub adapter")
    parser.add_argument("--max-length", type=int, default=512)
    parser.set_defaults(run=run)


def read_inputs(texts: List[str], file: Optional[str]) -> List[Tuple[str, Optional[str]]]:
    """(text, pair-or-None) for every input, from the arguments or the file."""
    if texts and file:
        raise CliError("give texts or --file, not both.")
    if file:
        if not os.path.isfile(file):
            raise CliError(f"no such file: {file!r}.")
        with open(file, encoding="utf-8") as handle:
            lines = [line.rstrip("\n") for line in handle if line.strip()]
        rows = [tuple(line.split("\t", 1)) if "\t" in line else (line, None) for line in lines]
    else:
        rows = [tuple(p.strip() for p in t.split(PAIR_SEPARATOR, 1)) if PAIR_SEPARATOR in t else (t, None) for t in texts]
    if not rows:
        raise CliError("nothing to predict: give one or more TEXT arguments or --file.")
    return [(row[0], row[1] if len(row) > 1 else None) for row in rows]


def run(args: argparse.Namespace) -> int:
    if args.top_k < 1:
        raise CliError("--top-k must be at least 1.")
    inputs = read_inputs(args.texts, args.file)
    adapter, folder = load_adapter_files(args.adapter, args.revision)
    task = adapter.config.task_type
    if task not in TASKS:
        raise CliError(f"predict handles classification, tagging and QA adapters; this one is {task or 'untyped'} "
                       f"({adapter.config.architecture}). Load it with AutoBitFitModel.from_pretrained instead.")
    tokenizer = load_tokenizer(folder, adapter.config)
    if tokenizer is None:
        raise CliError(f"no tokenizer beside the adapter or at its base {adapter.config.base_model_name_or_path!r}.")
    from bitfit_hf.adapters.auto import AutoBitFitModel

    model = AutoBitFitModel.from_pretrained(adapter).eval()
    predict = {"SEQ_CLS": _classify, "TOKEN_CLS": _tag, "QUESTION_ANS": _answer}[task]
    for text, pair in inputs:
        print(predict(model, tokenizer, text, pair, args))
    return 0


def _encode(tokenizer, text, pair, args, **kwargs):
    return tokenizer(text, pair, return_tensors="pt", truncation=True, max_length=args.max_length, **kwargs)


def _classify(model, tokenizer, text, pair, args) -> str:
    import torch

    with torch.no_grad():
        logits = model(**_encode(tokenizer, text, pair, args)).logits[0]
    if logits.numel() == 1 and model.config.problem_type == "regression":
        return f"{logits.item():.4f}\t{text}"
    probs = logits.softmax(-1)
    top = probs.topk(min(args.top_k, probs.numel()))
    labels = ", ".join(f"{model.config.id2label[int(i)]} {p:.4f}" for p, i in zip(top.values.tolist(), top.indices.tolist()))
    return f"{labels}\t{text}" + (f" {PAIR_SEPARATOR} {pair}" if pair else "")


def _tag(model, tokenizer, text, pair, args) -> str:
    import torch

    words = text.split()
    encoded = tokenizer(words, is_split_into_words=True, return_tensors="pt", truncation=True, max_length=args.max_length)
    with torch.no_grad():
        predicted = model(**encoded).logits[0].argmax(-1).tolist()
    tags, seen = {}, set()
    for position, word in enumerate(encoded.word_ids(0)):
        if word is not None and word not in seen:  # the first sub-token carries the word's label
            seen.add(word)
            tags[word] = model.config.id2label[predicted[position]]
    return " ".join(f"{w}/{tags.get(i, '?')}" for i, w in enumerate(words))


def _answer(model, tokenizer, text, pair, args) -> str:
    import torch

    if not pair:
        raise CliError(f"a QA adapter needs 'question {PAIR_SEPARATOR} context' (or a tab-separated line).")
    encoded = _encode(tokenizer, text, pair, args, return_offsets_mapping=True)
    offsets = encoded.pop("offset_mapping")[0].tolist()
    sequence = encoded.sequence_ids(0)
    with torch.no_grad():
        out = model(**encoded)
    context = [i for i, s in enumerate(sequence) if s == 1]
    start_logits, end_logits = out.start_logits[0], out.end_logits[0]
    best, span = float("-inf"), (context[0], context[0])
    for start in context:
        for end in context[context.index(start): context.index(start) + 30]:
            score = float(start_logits[start] + end_logits[end])
            if score > best:
                best, span = score, (start, end)
    answer = pair[offsets[span[0]][0]: offsets[span[1]][1]]
    return f"{answer}\t{best:.2f}\t{text}"
