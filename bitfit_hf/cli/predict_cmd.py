"""``bitfit-hf predict ADAPTER TEXT...``: the stock base plus the adapter, on a few texts.

Sequence classification prints the top labels with their probabilities (regression: the value);
sentence pairs are written ``first ||| second`` (or tab-separated in ``--file``); token
classification prints ``word/TAG`` for every word; extractive QA takes ``question ||| context``.

Inputs are never changed silently. Refused (one error line, exit 2, before the model loads): a pair for a
tagging adapter (it would tag the first half only); a pair for a classifier trained on single texts, or a
single text for one trained on pairs (adapters record their text columns, as the glue recipe's do; older
adapters take both); a QA question without a context. Run with a warning on stderr: an input longer than
the model reads (``--max-length``, lowered to the tokenizer's and the model's limit) is read up to that
limit, and the warning says so: the tagger names the words it left untagged (``word/?``), QA says the
context was cut (an answer past the cut cannot be found).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Tuple

from bitfit_hf.cli.adapter_source import load_adapter_files, load_tokenizer, local_path
from bitfit_hf.cli.errors import CliError

PAIR_SEPARATOR = "|||"
TASKS = ("SEQ_CLS", "TOKEN_CLS", "QUESTION_ANS")


def register(verbs) -> None:
    parser = verbs.add_parser("predict", help="run an adapter on texts (labels with scores, tags, or answers)",
                              description=" ".join(__doc__.split("\n\n")[1:3]).replace("\n", " "))
    parser.add_argument("adapter", type=local_path, help="adapter folder, or Hub id")
    parser.add_argument("texts", nargs="*", metavar="TEXT", help=f"inputs; a pair as 'first {PAIR_SEPARATOR} second'")
    parser.add_argument("--file", type=local_path, help="read inputs from this file, one per line (a tab separates a pair)")
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
    if args.max_length < 1:
        raise CliError("--max-length must be at least 1.")
    inputs = read_inputs(args.texts, args.file)
    adapter, folder = load_adapter_files(args.adapter, args.revision)
    task = adapter.config.task_type
    if task not in TASKS:
        raise CliError(f"predict handles classification, tagging and QA adapters; this one is {task or 'untyped'} "
                       f"({adapter.config.architecture}). Load it with AutoBitFitModel.from_pretrained instead.")
    check_inputs(adapter.config, inputs)  # before any model is loaded
    tokenizer = load_tokenizer(folder, adapter.config)
    if tokenizer is None:
        raise CliError(f"no tokenizer beside the adapter or at its base {adapter.config.base_model_name_or_path!r}.")
    from bitfit_hf.adapters.auto import AutoBitFitModel

    model = AutoBitFitModel.from_pretrained(adapter).eval()
    limit = Limit.of(args.max_length, tokenizer, model)
    predict = {"SEQ_CLS": _classify, "TOKEN_CLS": _tag, "QUESTION_ANS": _answer}[task]
    for number, (text, pair) in enumerate(inputs, start=1):
        print(predict(model, tokenizer, text, pair, args, Inputs(number, limit)))
    return 0


def _shown(text: str, pair: Optional[str]) -> str:
    full = text if pair is None else f"{text} {PAIR_SEPARATOR} {pair}"
    return repr(full if len(full) <= 60 else full[:57] + "...")


def check_inputs(config, inputs: List[Tuple[str, Optional[str]]]) -> None:
    """Refuse inputs the adapter cannot take as given, instead of changing them: a pair for a tagger, a pair for a
    classifier trained on single texts or a single text for one trained on pairs (when the adapter records its
    text columns, as the glue recipe's do), a question without a context for QA."""
    task = config.task_type
    columns = (config.metadata or {}).get("text_columns")
    columns = [c for c in columns if c] if isinstance(columns, list) else None
    for number, (text, pair) in enumerate(inputs, start=1):
        if task == "TOKEN_CLS" and pair is not None:
            raise CliError(f"a tagging adapter tags one sentence per input; input {number} is a pair "
                           f"({_shown(text, pair)}). Give each sentence as an input of its own (no "
                           f"'{PAIR_SEPARATOR}', no tab in --file).")
        if task == "SEQ_CLS" and columns and len(columns) == 1 and pair is not None:
            raise CliError(f"this adapter classifies single texts (trained on the column {columns[0]!r}); input "
                           f"{number} is a pair ({_shown(text, pair)}). Give one text per input.")
        if task == "SEQ_CLS" and columns and len(columns) == 2 and pair is None:
            raise CliError(f"this adapter classifies pairs ({columns[0]} {PAIR_SEPARATOR} {columns[1]}); input {number} "
                           f"is a single text ({_shown(text, pair)}). Write each input as 'first {PAIR_SEPARATOR} "
                           "second' (a tab between them in --file).")
        if task == "QUESTION_ANS" and not pair:
            raise CliError(f"a QA adapter needs 'question {PAIR_SEPARATOR} context' (or a tab-separated line); input "
                           f"{number} has no context.")


class Limit:
    """The most tokens the model reads per input: ``--max-length``, lowered to what the tokenizer and the
    model's position embeddings allow; ``why`` says which one it is, for the warnings."""

    def __init__(self, tokens: int, why: str):
        self.tokens, self.why = tokens, why

    @classmethod
    def of(cls, asked: int, tokenizer, model) -> "Limit":
        found = [(asked, f"--max-length {asked}")]
        tok = getattr(tokenizer, "model_max_length", None)
        if isinstance(tok, int) and 0 < tok < 1_000_000:
            found.append((tok, f"the tokenizer's limit, {tok}"))
        config = getattr(model, "config", None)
        positions = getattr(config, "max_position_embeddings", None)
        if isinstance(positions, int) and positions > 0:
            if getattr(config, "model_type", "") in _OFFSET_POSITIONS:  # positions start after the padding index
                positions -= int(getattr(config, "pad_token_id", 1) or 1) + 1
            found.append((positions, f"the model's {positions} positions"))
        tokens, why = min(found, key=lambda pair: pair[0])
        return cls(tokens, why)


_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "longformer", "mpnet", "xlm-roberta-xl")


class Inputs:
    """Where one input stands: its number (for messages) and the length limit."""

    def __init__(self, number: int, limit: Limit):
        self.number, self.limit = number, limit

    def warn(self, message: str) -> None:
        print(f"bitfit-hf predict: warning: input {self.number}{message}", file=sys.stderr)


def _quiet_tokenizer():
    """Counting an input's full length must not print transformers' 'longer than the maximum' warning."""
    from bitfit_hf.utils.quiet import transformers_errors_only

    return transformers_errors_only()


def _full_length(tokenizer, text, pair=None, **kwargs) -> int:
    with _quiet_tokenizer():
        return len(tokenizer(text, pair, truncation=False, **kwargs)["input_ids"])


def _encode(tokenizer, text, pair, where: Inputs, **kwargs):
    return tokenizer(text, pair, return_tensors="pt", truncation=kwargs.pop("truncation", True),
                     max_length=where.limit.tokens, **kwargs)


def _classify(model, tokenizer, text, pair, args, where: Inputs) -> str:
    import torch

    length = _full_length(tokenizer, text, pair)
    if length > where.limit.tokens:
        where.warn(f" is {length} tokens long; the model read the first {where.limit.tokens} ({where.limit.why}), "
                   "the rest was not used.")
    with torch.no_grad():
        logits = model(**_encode(tokenizer, text, pair, where)).logits[0]
    if logits.numel() == 1 and model.config.problem_type == "regression":
        return f"{logits.item():.4f}\t{text}"
    probs = logits.softmax(-1)
    top = probs.topk(min(args.top_k, probs.numel()))
    labels = ", ".join(f"{model.config.id2label[int(i)]} {p:.4f}" for p, i in zip(top.values.tolist(), top.indices.tolist()))
    return f"{labels}\t{text}" + (f" {PAIR_SEPARATOR} {pair}" if pair else "")


def _tag(model, tokenizer, text, pair, args, where: Inputs) -> str:
    import torch

    words = text.split()
    encoded = tokenizer(words, is_split_into_words=True, return_tensors="pt", truncation=True,
                        max_length=where.limit.tokens)
    with torch.no_grad():
        predicted = model(**encoded).logits[0].argmax(-1).tolist()
    tags, seen = {}, set()
    for position, word in enumerate(encoded.word_ids(0)):
        if word is not None and word not in seen:  # the first sub-token carries the word's label
            seen.add(word)
            tags[word] = model.config.id2label[predicted[position]]
    untagged = [i for i in range(len(words)) if i not in tags]
    if untagged:
        where.warn(f": words {untagged[0] + 1}-{untagged[-1] + 1} of {len(words)} are past the {where.limit.tokens}-token "
                   f"limit and were not tagged (shown as word/?; {where.limit.why}).")
    return " ".join(f"{w}/{tags.get(i, '?')}" for i, w in enumerate(words))


def _answer(model, tokenizer, text, pair, args, where: Inputs) -> str:
    import torch

    length = _full_length(tokenizer, text, pair)
    try:
        encoded = _encode(tokenizer, text, pair, where, truncation="only_second", return_offsets_mapping=True)
    except Exception as err:  # noqa: BLE001 - tokenizers raise several types when the question alone is too long
        raise CliError(f"input {where.number}: the question alone is longer than {where.limit.tokens} tokens "
                       f"({where.limit.why}): {err}") from None
    offsets = encoded.pop("offset_mapping")[0].tolist()
    sequence = encoded.sequence_ids(0)
    context = [i for i, s in enumerate(sequence) if s == 1]
    if not context:
        raise CliError(f"input {where.number}: no room left for the context within {where.limit.tokens} tokens "
                       f"({where.limit.why}).")
    if length > where.limit.tokens:
        kept = pair[: offsets[context[-1]][1]]
        where.warn(f": the context was cut at {where.limit.tokens} tokens with the question ({where.limit.why}): only "
                   f"its first {len(kept)} of {len(pair)} characters were read; an answer past it cannot be found.")
    with torch.no_grad():
        out = model(**encoded)
    start_logits, end_logits = out.start_logits[0], out.end_logits[0]
    best, span = float("-inf"), (context[0], context[0])
    for start in context:
        for end in context[context.index(start): context.index(start) + 30]:
            score = float(start_logits[start] + end_logits[end])
            if score > best:
                best, span = score, (start, end)
    answer = pair[offsets[span[0]][0]: offsets[span[1]][1]]
    return f"{answer}\t{best:.2f}\t{text}"
